"""Pure decision logic: drain state machine, startup advisories, and (for the controller) deletion
stages, recycling choices and lifecycle rules.

Rule of this package: purely data-manipulative and computational. No I/O, no clock of its own (``now``
is always a parameter), no imports of aiohttp, kopf, prometheus_client or structlog. Callers gather
observations, call a function here, and carry out the decision it returns.
"""
