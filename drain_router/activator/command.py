"""``drain-router activator``: flags -> the router's :class:`~drain_router.config.Config` (listeners,
drain, logs: validated by :func:`~drain_router.config.build_config`, as ``serve``'s) and
:class:`~.settings.ActivatorSettings` -> run. Every flag can also come from
``DRAIN_ROUTER_ACTIVATOR_<FLAG_IN_CAPS>``. The options are built from the settings they fill
(:mod:`drain_router.config.flags`): the router's take their defaults and parsers from the router's
settings, with the activator's headings and help; its own are declared whole in :mod:`.settings`."""

from __future__ import annotations

import sys
from typing import Any

import click

from drain_router import early_signals
from drain_router.activator import settings as settings_
from drain_router.activator.settings import DRAIN, LISTENERS, LOGS
from drain_router.config import flags, usage
from drain_router.config.command import CommandOptions
from drain_router.decisions import activator

COMMAND = "activator"
"""Whose variables: ``DRAIN_ROUTER_ACTIVATOR_<FLAG>`` (:func:`~drain_router.config.flags.env_name`)."""

OPTIONS = CommandOptions(COMMAND, settings_.ActivatorSettings, no_upstream=settings_.NO_UPSTREAM, case_sensitive=True)
_router, _own = OPTIONS.router, OPTIONS.mine


_options = flags.options(
    [
        _router(
            "host",
            LISTENERS,
            "Address of the traffic listeners: one per port of the port map (--ports-configmap), each "
            "for one service and protocol. No other traffic port is opened.",
        ),
        _router("admin-host", LISTENERS, "Admin listener address."),
        _router(
            "admin-port",
            LISTENERS,
            "Admin listener port: /livez, /readyz (503 from SIGTERM on), /metrics, /admin/ports (the "
            "ports listened on now, which the controller probes). Keep it outside the controller's "
            "--activator-ports range.",
        ),
        _own("queue-size"),
        _own("activation-timeout-secs"),
        _own("max-services"),
        _own("poll-interval-secs"),
        _own("kube-api"),
        _own("ports-configmap"),
        _router(
            "shutdown-drain-secs",
            DRAIN,
            "After SIGTERM, keep holding and forwarding this long with /readyz answering 503, so the "
            "Service's endpoints drop this pod; then held requests get 503 and the listener closes.",
        ),
        _router(
            "termination-grace-secs",
            DRAIN,
            "The pod's terminationGracePeriodSeconds: at SIGTERM + grace - 2 s, what is still forwarded "
            "is aborted and the process exits 1. Unset: it waits until killed.",
        ),
        _router("log-level", LOGS),
        _router("log-format", LOGS),
    ]
)


@click.command(
    "activator",
    cls=usage.SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@_options
def command(**given: Any) -> None:
    """Hold the requests of ModelServices scaled to zero, ask for a wake, forward them once ready."""
    early_signals.install()
    cfg, settings = OPTIONS.split(given)
    if settings.ports_configmap is None:
        raise click.UsageError("--ports-configmap NAMESPACE/NAME is required (the controller's port map)")
    from drain_router.activator import kube

    try:
        activator.configmap_ref(settings.ports_configmap, kube.own_namespace())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--ports-configmap'") from None
    from drain_router import logs
    from drain_router.activator import process  # the event loop, httptools and aiohttp only when serving

    logs.configure(format=cfg.log.format, level=cfg.log.level)
    sys.exit(process.serve(cfg, settings, pending_signals=early_signals.pending))
