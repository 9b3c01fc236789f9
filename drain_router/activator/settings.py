"""The activator's own settings (the listeners', the drain's and the logs' are the router's
:class:`~drain_router.config.Config`, validated by :func:`~drain_router.config.build_config`)."""

from __future__ import annotations

import dataclasses

from drain_router.decisions import activation

NO_UPSTREAM = "http://127.0.0.1:9"
"""The router's configuration names a model server; the activator has one per service, never this."""
DEFAULT_QUEUE_SIZE = 1000
"""Requests held per service: a burst of clients arriving during a cold start, bounded so a flood
costs bounded memory (each held request is a parsed head and its connection)."""
DEFAULT_MAX_SERVICES = 1000
"""Services with requests held at once: the routes that point at the activator name them, so a
made-up name cannot grow the table past this."""
DEFAULT_POLL_INTERVAL_SECS = 1
"""How often a waking service's pods are listed and their routers probed: a second is small beside
a cold start and light on the API server (one list per waking service)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivatorSettings:
    queue_size: int = DEFAULT_QUEUE_SIZE
    """Requests held per service; one more is answered 429."""
    activation_timeout_secs: int = int(activation.DEFAULT_ACTIVATION_TIMEOUT_SECS)
    """How long a request is held before it is answered 503 with ``Retry-After``."""
    max_services: int = DEFAULT_MAX_SERVICES
    """Services in the table at once; a request for one more is answered 503."""
    poll_interval_secs: float = DEFAULT_POLL_INTERVAL_SECS
    """Between two lists of a service's pods (and probes of their routers)."""
    kube_api: str | None = None
    """The Kubernetes API's base URL (None: in cluster, from the service account)."""
    grpc_port: int | None = None
    """The gRPC (h2c) listener's port (None: no gRPC listener; 0: a free port)."""

    def __post_init__(self) -> None:
        for name, minimum in (("queue_size", 1), ("activation_timeout_secs", 1), ("max_services", 1)):
            if getattr(self, name) < minimum:
                raise ValueError(f"--{name.replace('_', '-')} must be at least {minimum}")
        if self.grpc_port is not None and not 0 <= self.grpc_port < 65536:
            raise ValueError("--grpc-port must be a port (0-65535)")
        if self.poll_interval_secs <= 0:
            raise ValueError("--poll-interval-secs must be more than 0")
