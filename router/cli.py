"""The ``drain-router`` command line. It only translates: flags -> :func:`config.build_config` -> run.

Every flag of ``serve`` and ``check`` can also come from ``DRAIN_ROUTER_<FLAG_IN_CAPS>`` (for example
``DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS=60``). Exit status: 0 clean, 1 deadline aborted requests,
2 configuration error.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from router import config, entry

EXIT_CONFIG_ERROR = 2

#: Subcommands that live in other packages, imported only when invoked, so ``serve`` never loads kopf.
LAZY_COMMANDS = {
    "controller": ("router.controller.command", "Run the companion controller (needs the 'controller' extra)."),
    "fake-model": ("router.tools.fake_model", "A stand-in streaming model server, for demos and tests."),
    "demo": ("router.tools.demo", "Show a rolling restart with and without the drain, on this machine."),
}


class LazyGroup(click.Group):
    """A click group whose listed subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, _ = LAZY_COMMANDS[cmd_name]
            command = importlib.import_module(module_name).command
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Describe lazy commands without importing them (help must not need kopf).
        rows = [(name, cmd.get_short_help_str(60)) for name, cmd in self.commands.items()]
        rows += [(name, help_) for name, (_, help_) in LAZY_COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


def _env(flag: str) -> str:
    return "DRAIN_ROUTER_" + flag.upper().replace("-", "_")


def _option(flag: str, **kwargs: Any) -> Callable[[click.decorators.FC], click.decorators.FC]:
    return click.option(f"--{flag}", envvar=_env(flag), show_envvar=True, **kwargs)


ROUTER_OPTIONS = [
    _option("upstream", required=True, metavar="URL",
            help="The model server: http://HOST:PORT or unix:/path/to.sock. Requests are forwarded with "
                 "their path and query unchanged."),
    _option("host", default="0.0.0.0", show_default=True, help="Main (traffic) listener address."),
    _option("port", default="8080", show_default=True, help="Main (traffic) listener port; point the Service here."),
    _option("admin-host", default="0.0.0.0", show_default=True, help="Admin listener address."),
    _option("admin-port", default="9091", show_default=True,
            help="Admin listener port: /livez, /readyz, /metrics, /admin/*. The model server's preStop "
                 "hook calls /admin/drain-wait here. Must differ from --port."),
    _option("shutdown-drain-secs", default="30", show_default=True, metavar="SECS",
            help="After SIGTERM, keep serving this long with /readyz answering 503, so endpoint removal "
                 "reaches kube-proxy and gateways before the listener closes. If a probe-driven load "
                 "balancer removes the pod, size it above failureThreshold * periodSeconds. It must "
                 "leave room under terminationGracePeriodSeconds for in-flight streams: the default "
                 "equals the Kubernetes default grace, so startup warns until you declare a larger "
                 "--termination-grace-secs. 0 disables the pause. At most 1800."),
    _option("termination-grace-secs", default=None, metavar="SECS",
            help="The pod's real terminationGracePeriodSeconds (feed both from one value). Enables the "
                 "deadline: at SIGTERM + grace - 2 s, remaining requests are aborted, counted and the "
                 "router exits 1. Unset: the advisory assumes the Kubernetes default 30, and the router "
                 "waits for in-flight work until it is killed."),
    _option("readiness-probe-period-secs", default=None, metavar="SECS",
            help="The load balancer's readiness probe period, declared so startup can check the drain "
                 "window against failureThreshold * periodSeconds."),
    _option("readiness-probe-failure-threshold", default=None, metavar="N",
            help="The load balancer's readiness probe failure threshold (with the period above)."),
    _option("upstream-health-path", default=None, metavar="PATH",
            help="When set (e.g. /health), /readyz also needs the model server to answer 2xx there; the "
                 "router stays 'starting' until it first does."),
    _option("upstream-health-interval-secs", default="2", show_default=True, metavar="SECS",
            help="How often the upstream health path is polled."),
    _option("upstream-connect-timeout-secs", default="5", show_default=True, metavar="SECS",
            help="Connect timeout to the model server (answered 504). There is no read timeout: "
                 "completions stream for minutes and prefill can be silent."),
    _option("upstream-max-connections", default="0", show_default=True, metavar="N",
            help="Pooled keep-alive connections to the model server; 0 = no limit. A limit caps "
                 "concurrent streams (excess requests queue)."),
    _option("max-request-body-bytes", default=str(config.DEFAULT_MAX_REQUEST_BODY_BYTES), show_default=True,
            metavar="BYTES", help="Larger request bodies are answered 413."),
    _option("client-header-timeout-secs", default=str(config.DEFAULT_CLIENT_HEADER_TIMEOUT_SECS), show_default=True,
            metavar="SECS",
            help="A client's request head must arrive whole within this long (from the connection opening, "
                 "or from its first byte on a reused connection), else the connection is closed: bounds "
                 "slowloris clients. Never applies to request bodies or streaming responses."),
    _option("client-keepalive-timeout-secs", default=str(config.DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS),
            show_default=True, metavar="SECS",
            help="Close a client's keep-alive connection after this long with no request. Keep it above "
                 "your load balancer's own idle timeout for pooled connections (AWS ALB 60, GCP 600), so "
                 "the balancer always closes first and no pooled request races the close."),
    _option("log-format", default="json", show_default=True, type=click.Choice(config.LOG_FORMATS),
            help="json: one object a line on stdout, for aggregators. console: for a terminal."),
    _option("log-level", default="info", show_default=True, type=click.Choice(config.LOG_LEVELS, case_sensitive=False)),
    click.option("--access-log/--no-access-log", envvar=_env("access-log"), show_envvar=True, default=False,
                 show_default=True, help="One structured line per proxied request."),
]


def router_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(ROUTER_OPTIONS):
        func = option(func)
    return func


def _build(params: dict[str, Any]) -> config.Config:
    try:
        return config.build_config(**params)
    except config.ConfigError as exc:
        # click prints "Error: Invalid value for '--flag': ..." and exits 2.
        raise click.BadParameter(
            f"{exc.value!r}: {exc.reason}", param_hint=f"'{config.flag_name(exc.field)}'"
        ) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="drain-router")
@click.pass_context
def main(ctx: click.Context) -> None:
    """drain-router: lossless pod termination for LLM model servers on Kubernetes."""
    if ctx.invoked_subcommand != "serve":
        entry.release()  # only serve drains; every other command gets the default signal handling


@main.command()
@router_options
def serve(**params: Any) -> None:
    """Run the draining reverse proxy in front of a model server."""
    # The entry point has recorded terminating signals since the process started (installed again
    # here for callers that did not come through it); the lifecycle replays them on its loop.
    entry.install()
    cfg = _build(params)
    from router import logs
    from router.proxy import lifecycle  # the event loop and aiohttp only when serving

    logs.configure(format=cfg.log.format, level=cfg.log.level)
    sys.exit(lifecycle.serve(cfg, pending_signals=entry.pending))


@main.command()
@router_options
def check(**params: Any) -> None:
    """Print the effective configuration and advisories as JSON; exit 0, or 2 on a hard error."""
    cfg = _build(params)
    click.echo(json.dumps(config.effective(cfg), indent=2, sort_keys=True))
