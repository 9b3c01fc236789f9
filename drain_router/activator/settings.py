"""The activator's own settings (the listeners', the drain's and the logs' are the router's
:class:`~drain_router.config.Config`, validated by :func:`~drain_router.config.build_config`). Each
is declared once, as a field with its default and its
:class:`~drain_router.config.flags.Flag` (flag, bounds, metavar, help, heading), from which
``drain-router activator`` builds its option (:mod:`drain_router.config.flags`)."""

from __future__ import annotations

import dataclasses

import click

from drain_router.config.flags import Flag, check_bounds, setting
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


#: The headings of ``activator --help``, in the order they are listed.
LISTENERS = "Listeners"
HOLDING = "Holding requests"
KUBERNETES = "Kubernetes"
DRAIN = "Shutdown"
LOGS = "Logs"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivatorSettings:
    queue_size: int = setting(
        DEFAULT_QUEUE_SIZE,
        Flag(
            name="queue-size",
            heading=HOLDING,
            type=click.IntRange(min=1),
            metavar="N",
            help="Requests held per service while it wakes; one more is answered 429 with Retry-After.",
        ),
    )
    """Requests held per service; one more is answered 429."""
    activation_timeout_secs: int = setting(
        int(activation.DEFAULT_ACTIVATION_TIMEOUT_SECS),
        Flag(
            name="activation-timeout-secs",
            heading=HOLDING,
            type=click.IntRange(min=1),
            metavar="SECS",
            help="How long a request is held for a wake; past it, 503 with Retry-After from the service's "
            "last cold start. Match the ModelService's activationTimeout.",
        ),
    )
    """How long a request is held before it is answered 503 with ``Retry-After``."""
    max_services: int = setting(
        DEFAULT_MAX_SERVICES,
        Flag(
            name="max-services",
            heading=HOLDING,
            type=click.IntRange(min=1),
            metavar="N",
            help="Services the activator holds requests for at once; a request for one more is answered 503.",
        ),
    )
    """Services in the table at once; a request for one more is answered 503."""
    poll_interval_secs: float = setting(
        DEFAULT_POLL_INTERVAL_SECS,
        Flag(
            name="poll-interval-secs",
            heading=KUBERNETES,
            type=click.FloatRange(min=0, min_open=True),
            metavar="SECS",
            help="While a service wakes: how often its pods are listed and their routers' /readyz probed "
            "(and the ModelService read again). The first ready router gets the held requests.",
        ),
    )
    """Between two lists of a service's pods (and probes of their routers)."""
    kube_api: str | None = setting(
        None,
        Flag(
            name="kube-api",
            heading=KUBERNETES,
            metavar="URL",
            help="The Kubernetes API's base URL, without credentials (out of cluster, or a stand-in). "
            "Unset: in cluster, from the pod's service account.",
        ),
    )
    """The Kubernetes API's base URL (None: in cluster, from the service account)."""
    grpc_port: int | None = setting(
        None,
        Flag(
            name="grpc-port",
            heading=LISTENERS,
            type=click.IntRange(min=0, max=65535),
            metavar="PORT",
            help="gRPC (h2c, prior knowledge) listener port: the activator Service's grpc port, where a "
            "GRPCRoute of a sleeping service points. Calls are held like requests (RESOURCE_EXHAUSTED "
            "when the queue is full, UNAVAILABLE past the timeout) and forwarded to the pod router's "
            "spec.router.grpcPort. Unset: no gRPC listener. 0 picks a free port (logged).",
        ),
    )
    """The gRPC (h2c) listener's port (None: no gRPC listener; 0: a free port)."""

    def __post_init__(self) -> None:
        # The bounds are the flags' (what click refuses on the command line), for library callers.
        check_bounds(self)
