"""``python -m router`` is ``drain-router``."""

from router.cli import main

main()
