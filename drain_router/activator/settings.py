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
"""Services with listeners at once: as many as the controller's default port range has (20000-20999,
one port per service and protocol), so by default it is the controller's range that bounds them."""
DEFAULT_POLL_INTERVAL_SECS = 1
"""How often the port map is read, and a waking service's pods listed and their routers probed: a
second is small beside a cold start and light on the API server (one GET of the map, and per service
with requests at most one read, one patch and one list)."""


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
            help="Services the activator opens listeners for at once (each of its assigned ports, HTTP and "
            "gRPC). A service past it in the port map gets no listener: its connections are refused, a "
            "warning is logged, and /admin/ports does not list its ports, so the controller does not send "
            "it here.",
        ),
    )
    """Services with listeners at once (those listened to already keep theirs; the next by port)."""
    poll_interval_secs: float = setting(
        DEFAULT_POLL_INTERVAL_SECS,
        Flag(
            name="poll-interval-secs",
            heading=KUBERNETES,
            type=click.FloatRange(min=0, min_open=True),
            metavar="SECS",
            help="How often the port map is read (one GET whatever the traffic: a newly assigned port is "
            "opened, a released one closed, within this); and, for each service with requests, how often "
            "its ModelService is read, a wake asked for, its pods listed and their routers' /readyz "
            "probed (at most one read, one status patch and one list per service per interval, "
            "whatever the clients send). A service refused (403, 404) is refused at once for this long.",
        ),
    )
    """Between two reads of the port map, and two polls of one service (read, patch, list)."""
    ports_configmap: str | None = setting(
        None,
        Flag(
            name="ports-configmap",
            heading=KUBERNETES,
            metavar="NAMESPACE/NAME",
            help="The port map the controller writes (<activator Service>-ports in the activator's "
            "namespace): which port is which ModelService's, and for HTTP or gRPC. The activator listens "
            "on exactly those ports, and a request's service is its port's, never anything the client "
            "sends. NAME alone: in the pod's own namespace (in cluster). Required.",
        ),
    )
    """The port map's ConfigMap, ``NAMESPACE/NAME`` or ``NAME`` (the pod's namespace)."""
    kube_api: str | None = setting(
        None,
        Flag(
            name="kube-api",
            heading=KUBERNETES,
            metavar="URL",
            help="A Kubernetes API base URL called without credentials (a stand-in). Unset: the pod's "
            "service account in a cluster, else KUBECONFIG (each path of the list) or ~/.kube/config, as "
            "the controller; with neither, one activator.no_cluster line and exit status 2.",
        ),
    )
    """A Kubernetes API base URL called without credentials (None: :mod:`drain_router.kubelogin`'s rule)."""

    def __post_init__(self) -> None:
        # The bounds are the flags' (what click refuses on the command line), for library callers.
        check_bounds(self)
