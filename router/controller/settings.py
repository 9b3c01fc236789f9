"""The controller's settings: one frozen object built by the ``controller`` subcommand. No kopf here."""

from __future__ import annotations

import dataclasses

DEFAULT_REQUEUE_SECS = 5.0
DEFAULT_METRICS_PORT = 9092


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch ModelServices in. Empty only together with ``all_namespaces``."""
    all_namespaces: bool = False
    """Watch the whole cluster (needs a ClusterRole instead of a Role)."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """Prometheus ``/metrics`` port; 0 disables the listener. 9092: next to the router's 9091."""
    requeue_secs: float = DEFAULT_REQUEUE_SECS
    """Every wait of the staged deletion is a requeue after this many seconds (the route settle waits
    for its exact remainder instead). 5 s: short against a 60 s settle and a 30 s pod grace, cheap in
    API calls (a handful of GETs per ModelService being deleted)."""
    log_level: str = "info"
    """kopf's and the controller's log level."""
    finalizer: str = "drainrouter.dev/staged-deletion"
    """The finalizer that holds a ModelService until its teardown is over."""

    def __post_init__(self) -> None:
        if bool(self.namespaces) == self.all_namespaces:
            raise ValueError("give --namespace (one or more) or --all-namespaces, not both and not neither")
        if self.requeue_secs <= 0:
            raise ValueError(f"requeue_secs={self.requeue_secs!r} must be positive")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port={self.metrics_port!r} is not a port")
