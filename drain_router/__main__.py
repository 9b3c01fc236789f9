"""``python -m drain_router`` is ``drain-router``."""

from drain_router.entry import main

main()
