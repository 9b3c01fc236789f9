"""``drain-router controller``: flags -> :class:`ControllerSettings` -> run. kopf is imported only
inside the command body, so ``drain-router --help`` and the sidecar never load it."""

from __future__ import annotations

import sys

import click

from router import config
from router.controller import crd
from router.controller import settings as settings_


@click.command("controller", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar="DRAIN_ROUTER_CONTROLLER_NAMESPACE",
    show_envvar=True,
    metavar="NS",
    help="Watch ModelServices in this namespace; repeat for several (the environment variable "
    "takes a space-separated list). Needs only a namespaced Role.",
)
@click.option(
    "--all-namespaces",
    is_flag=True,
    envvar="DRAIN_ROUTER_CONTROLLER_ALL_NAMESPACES",
    show_envvar=True,
    help="Watch every namespace (needs a ClusterRole).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=settings_.DEFAULT_METRICS_PORT,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_METRICS_PORT",
    show_envvar=True,
    help="Prometheus /metrics port for drain_router_controller_*; 0 disables it.",
)
@click.option(
    "--liveness-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LIVENESS_PORT",
    show_envvar=True,
    help="Serve kopf's liveness endpoint GET /healthz on this port (for a livenessProbe); 0: none.",
)
@click.option(
    "--node-reads/--no-node-reads",
    default=True,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_NODE_READS",
    show_envvar=True,
    help="Read the node of a pod stuck terminating (needs get on nodes, cluster-scoped). "
    "--no-node-reads for a namespaced install without a ClusterRole: nodes then count as Ready.",
)
@click.option(
    "--requeue-secs",
    type=click.FloatRange(min=0, min_open=True),
    default=settings_.DEFAULT_REQUEUE_SECS,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_REQUEUE_SECS",
    show_envvar=True,
    help="Every wait of a staged deletion is a requeue after this long (the route settle "
    "requeues for its exact remainder).",
)
@click.option(
    "--log-format",
    type=click.Choice(config.LOG_FORMATS),
    default="json",
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LOG_FORMAT",
    show_envvar=True,
    help="json: one object a line on stdout, as the router logs. console: for a terminal.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LOG_LEVEL",
    show_envvar=True,
)
@click.option("--print-crd", is_flag=True, help="Print the ModelService CRD (what the chart ships) and exit.")
def command(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    metrics_port: int,
    liveness_port: int,
    node_reads: bool,
    requeue_secs: float,
    log_format: str,
    log_level: str,
    print_crd: bool,
) -> None:
    """Run the companion controller: staged deletion of ModelServices (needs the 'controller' extra)."""
    if print_crd:
        click.echo(crd.text(), nl=False)
        return
    try:
        cfg = settings_.ControllerSettings(
            namespaces=namespaces,
            all_namespaces=all_namespaces,
            metrics_port=metrics_port,
            liveness_port=liveness_port,
            read_nodes=node_reads,
            requeue_secs=requeue_secs,
            log_format=log_format,
            log_level=log_level.lower(),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        from router.controller import operator  # kopf and kubernetes_asyncio from here on
    except ModuleNotFoundError as exc:
        if exc.name not in ("kopf", "kubernetes_asyncio"):
            raise
        raise click.ClickException(
            f"the controller needs {exc.name}, which is not installed: pip install 'drain-router[controller]'"
        ) from None

    sys.exit(operator.run(cfg))
