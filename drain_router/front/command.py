"""``drain-router front``: flags -> the router's :class:`~drain_router.config.Config` (listeners,
admission, drain, logs and tracing: validated by :func:`~drain_router.config.build_config`, as
``serve``'s) and :class:`~.settings.FrontSettings` -> run. Every flag can also come from
``DRAIN_ROUTER_FRONT_<FLAG_IN_CAPS>``."""

from __future__ import annotations

import sys
from typing import Any

import click

from drain_router import config, early_signals
from drain_router.config import flags, usage
from drain_router.config.command import CommandOptions
from drain_router.front import settings as settings_
from drain_router.front.settings import DRAIN, HOLDING, LISTENERS, LOGS

COMMAND = "front"

OPTIONS = CommandOptions(COMMAND, settings_.FrontSettings, no_upstream=settings_.NO_UPSTREAM)
_router, _own = OPTIONS.router, OPTIONS.mine


_options = flags.options(
    [
        _router("host", LISTENERS, "Address of the traffic listener: the user's route points here."),
        _router("port", LISTENERS),
        _router("admin-host", LISTENERS),
        _router(
            "admin-port",
            LISTENERS,
            "Admin listener port: /livez, /readyz (503 from SIGTERM on), /metrics, /admin/inflight.",
        ),
        _own("service"),
        _own("pods"),
        _own("poll-interval-secs"),
        _own("kube-api"),
        _own("continuation"),
        _own("max-continuations"),
        _router(
            "max-concurrent-requests",
            HOLDING,
            "Requests in flight through the front at most (0: no limit of its own; each pod's router "
            "does its own admission).",
        ),
        _router(
            "queue-size",
            HOLDING,
            "Requests held while no pod is ready (scaled to zero, or every pod restarting), or past "
            "--max-concurrent-requests; one more is answered 429 with Retry-After.",
        ),
        _router(
            "queue-timeout-secs",
            HOLDING,
            "How long a request is held for a ready pod (fractions allowed); past it, 503 with Retry-After. "
            "Cover the service's cold start when it scales to zero.",
        ),
        _router("max-request-body-bytes", HOLDING),
        _router("upstream-connect-timeout-secs", HOLDING),
        _router(
            "shutdown-drain-secs",
            DRAIN,
            "After SIGTERM, keep serving this long with /readyz answering 503, so the front's Service "
            "drops this replica; then new connections are refused and what is in flight, continued "
            "streams too, runs to completion.",
        ),
        _router(
            "termination-grace-secs",
            DRAIN,
            "The front pod's terminationGracePeriodSeconds: at SIGTERM + grace - 2 s what is still in "
            "flight is cut and the process exits 1. Give the front a long grace: it holds its clients' "
            "streams for as long as they run.",
        ),
        _router("readiness-probe-period-secs", DRAIN),
        _router("readiness-probe-failure-threshold", DRAIN),
        _router("log-level", LOGS),
        _router("log-format", LOGS),
        _router("access-log", LOGS),
        _router("tracing", LOGS),
        _router("tracing-keep-query", LOGS),
    ]
)


@click.command(
    "front",
    cls=usage.SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@_options
def command(**given: Any) -> None:
    """Front one service's pods: spread, retry refusals, hold, continue cut streams on another pod."""
    early_signals.install()
    cfg, settings = OPTIONS.split(given)
    if settings.service is not None:
        try:
            settings.service_ref()
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    for url in settings.pod_urls():
        try:
            config.parse_upstream(url)
        except (ValueError, config.ConfigError) as exc:
            raise click.BadParameter(f"{url!r}: {exc}", param_hint="'--pods'") from None
    from drain_router import logs
    from drain_router.front import process  # the event loop, httptools and aiohttp only when serving

    logs.configure(format=cfg.log.format, level=cfg.log.level)
    sys.exit(process.serve(cfg, settings, pending_signals=early_signals.pending))
