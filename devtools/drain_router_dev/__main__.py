"""``python -m drain_router_dev`` is ``drain-router-dev``."""

from drain_router_dev.cli import main

main()
