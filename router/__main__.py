"""``python -m router`` is ``drain-router``."""

from router.entry import main

main()
