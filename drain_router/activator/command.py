"""``drain-router activator``: flags -> the router's :class:`~drain_router.config.Config` (listeners,
drain, logs: validated by :func:`~drain_router.config.build_config`, as ``serve``'s) and
:class:`~.settings.ActivatorSettings` -> run. Every flag can also come from
``DRAIN_ROUTER_ACTIVATOR_<FLAG_IN_CAPS>``."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from drain_router import config, early_signals
from drain_router.activator import settings as settings_
from drain_router.config import usage
from drain_router.decisions import activation

LISTENERS = "Listeners"
HOLDING = "Holding requests"
KUBERNETES = "Kubernetes"
DRAIN = "Shutdown"
LOGS = "Logs"


def _env(flag: str) -> str:
    return "DRAIN_ROUTER_ACTIVATOR_" + flag.upper().replace("-", "_")


def _option(flag: str, heading: str, help: str, **attrs: Any) -> Any:
    attrs.setdefault("show_default", attrs.get("default") is not None)
    return usage.option(f"--{flag}", heading=heading, envvar=_env(flag), show_envvar=True, help=help, **attrs)


OPTIONS = [
    _option("host", LISTENERS, "Traffic listener address.", default="0.0.0.0", metavar="ADDRESS"),
    _option(
        "port",
        LISTENERS,
        "Traffic listener port: the activator's Service, where the controller points a sleeping "
        "service's route. 0 picks a free port (logged).",
        default="8080",
        metavar="PORT",
    ),
    _option(
        "grpc-port",
        LISTENERS,
        "gRPC (h2c, prior knowledge) listener port: the activator Service's grpc port, where a GRPCRoute "
        "of a sleeping service points. Calls are held like requests (RESOURCE_EXHAUSTED when the queue is "
        "full, UNAVAILABLE past the timeout) and forwarded to the pod router's spec.router.grpcPort. "
        "Unset: no gRPC listener. 0 picks a free port (logged).",
        default=None,
        type=click.IntRange(min=0, max=65535),
        metavar="PORT",
    ),
    _option("admin-host", LISTENERS, "Admin listener address.", default="0.0.0.0", metavar="ADDRESS"),
    _option(
        "admin-port",
        LISTENERS,
        "Admin listener port: /livez, /readyz (503 from SIGTERM on), /metrics. Must differ from --port.",
        default="9091",
        metavar="PORT",
    ),
    _option(
        "queue-size",
        HOLDING,
        "Requests held per service while it wakes; one more is answered 429 with Retry-After.",
        default=settings_.DEFAULT_QUEUE_SIZE,
        type=click.IntRange(min=1),
        metavar="N",
    ),
    _option(
        "activation-timeout-secs",
        HOLDING,
        "How long a request is held for a wake; past it, 503 with Retry-After from the service's last "
        "cold start. Match the ModelService's activationTimeout.",
        default=int(activation.DEFAULT_ACTIVATION_TIMEOUT_SECS),
        type=click.IntRange(min=1),
        metavar="SECS",
    ),
    _option(
        "max-services",
        HOLDING,
        "Services the activator holds requests for at once; a request for one more is answered 503.",
        default=settings_.DEFAULT_MAX_SERVICES,
        type=click.IntRange(min=1),
        metavar="N",
    ),
    _option(
        "poll-interval-secs",
        KUBERNETES,
        "While a service wakes: how often its pods are listed and their routers' /readyz probed (and "
        "the ModelService read again). The first ready router gets the held requests.",
        default=settings_.DEFAULT_POLL_INTERVAL_SECS,
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECS",
    ),
    _option(
        "kube-api",
        KUBERNETES,
        "The Kubernetes API's base URL, without credentials (out of cluster, or a stand-in). Unset: in "
        "cluster, from the pod's service account.",
        default=None,
        metavar="URL",
    ),
    _option(
        "shutdown-drain-secs",
        DRAIN,
        "After SIGTERM, keep holding and forwarding this long with /readyz answering 503, so the "
        "Service's endpoints drop this pod; then held requests get 503 and the listener closes.",
        default="30",
        metavar="SECS",
    ),
    _option(
        "termination-grace-secs",
        DRAIN,
        "The pod's terminationGracePeriodSeconds: at SIGTERM + grace - 2 s, what is still forwarded "
        "is aborted and the process exits 1. Unset: it waits until killed.",
        default=None,
        metavar="SECS",
    ),
    _option("log-level", LOGS, "Minimum level logged.", default="info", type=click.Choice(config.LOG_LEVELS)),
    _option(
        "log-format",
        LOGS,
        "json: one object a line on stdout, for aggregators. console: for a terminal.",
        default="json",
        type=click.Choice(config.LOG_FORMATS),
    ),
]

#: The router's settings given from these flags (the rest keep their defaults).
ROUTER_FLAGS = (
    "host",
    "port",
    "admin_host",
    "admin_port",
    "shutdown_drain_secs",
    "termination_grace_secs",
    "log_level",
    "log_format",
)


def _options(func: Any) -> Any:
    for option in reversed(OPTIONS):
        func = option(func)
    return func


@click.command(
    "activator",
    cls=usage.SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@_options
def command(**given: Any) -> None:
    """Hold the requests of ModelServices scaled to zero, ask for a wake, forward them once ready."""
    early_signals.install()
    router = {name: given.pop(name) for name in ROUTER_FLAGS}
    try:
        cfg = config.build_config(upstream=settings_.NO_UPSTREAM, **router)
    except config.ConfigError as exc:
        raise click.BadParameter(
            f"{exc.value!r}: {exc.reason}", param_hint=f"'{config.flag_name(exc.field)}'"
        ) from None
    grpc_port = given["grpc_port"]
    if grpc_port and grpc_port in (cfg.proxy.port, cfg.admin.port):
        raise click.BadParameter("must differ from --port and --admin-port", param_hint="'--grpc-port'")
    try:
        settings = settings_.ActivatorSettings(**given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if settings.kube_api is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise click.UsageError("not in a cluster (no KUBERNETES_SERVICE_HOST): give --kube-api URL")
    from drain_router import logs
    from drain_router.activator import process  # the event loop, httptools and aiohttp only when serving

    logs.configure(format=cfg.log.format, level=cfg.log.level)
    sys.exit(process.serve(cfg, settings, pending_signals=early_signals.pending))
