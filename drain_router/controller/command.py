"""``drain-router controller``: flags -> :class:`ControllerSettings` -> run. kopf is imported only
inside the command body, so ``drain-router --help`` and the sidecar never load it."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import click

from drain_router import config
from drain_router.controller import crd
from drain_router.controller import settings as settings_


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
@click.option(
    "--leader-election/--no-leader-election",
    default=True,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION",
    show_envvar=True,
    help="Act only while holding a coordination.k8s.io/v1 Lease, so that of several replicas exactly "
    "one acts and a standby takes over within --leader-election-lease-duration plus "
    "--leader-election-retry-period of the leader's last renewal. --no-leader-election: act at "
    "once (then run exactly one replica).",
)
@click.option(
    "--leader-election-lease",
    default=settings_.DEFAULT_LEASE_NAME,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_LEASE",
    show_envvar=True,
    metavar="NAME",
    help="The Lease the replicas of one install compete for (one per install).",
)
@click.option(
    "--leader-election-namespace",
    default="",
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_NAMESPACE",
    show_envvar=True,
    metavar="NS",
    help="The Lease's namespace. Default: the pod's own (its service account's namespace), else the "
    "one --namespace watched.",
)
@click.option(
    "--leader-election-lease-duration",
    type=click.IntRange(min=1),
    default=settings_.DEFAULT_LEASE_DURATION_SECS,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_LEASE_DURATION",
    show_envvar=True,
    metavar="SECS",
    help="A standby takes the Lease from a leader that has not renewed it for this long (whole seconds).",
)
@click.option(
    "--leader-election-renew-deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=settings_.DEFAULT_RENEW_DEADLINE_SECS,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_RENEW_DEADLINE",
    show_envvar=True,
    metavar="SECS",
    help="A leader that cannot renew for this long stops acting: it exits with status 3 and restarts "
    "as a standby. Less than the lease duration (the rest is the safety margin).",
)
@click.option(
    "--leader-election-retry-period",
    type=click.FloatRange(min=0, min_open=True),
    default=settings_.DEFAULT_RETRY_PERIOD_SECS,
    show_default=True,
    envvar="DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_RETRY_PERIOD",
    show_envvar=True,
    metavar="SECS",
    help="The leader renews, and a standby looks at the Lease, this often. At most half the renew deadline.",
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
    leader_election: bool,
    leader_election_lease: str,
    leader_election_namespace: str,
    leader_election_lease_duration: int,
    leader_election_renew_deadline: float,
    leader_election_retry_period: float,
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
            leader_election=leader_election,
            lease_name=leader_election_lease,
            lease_namespace=leader_election_namespace or own_namespace() or _single(namespaces),
            identity=identity(),
            lease_duration_secs=leader_election_lease_duration,
            renew_deadline_secs=leader_election_renew_deadline,
            retry_period_secs=leader_election_retry_period,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        from drain_router.controller import operator  # kopf and kubernetes_asyncio from here on
    except ModuleNotFoundError as exc:
        if exc.name not in ("kopf", "kubernetes_asyncio"):
            raise
        raise MissingExtra(
            f"the controller needs {exc.name}, which is not installed: pip install 'drain-router[controller]'"
        ) from None

    sys.exit(operator.run(cfg))


class MissingExtra(click.ClickException):
    """An extra to install before the command can run: exit 2, as for a configuration error."""

    exit_code = 2


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The pod's namespace from its service account token mount; empty outside a pod."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return ""


def _single(namespaces: tuple[str, ...]) -> str:
    return namespaces[0] if len(namespaces) == 1 else ""


def identity() -> str:
    """A Lease ``holderIdentity`` unique to this process: the pod name (``HOSTNAME``) and a random
    suffix, so a restarted container never mistakes its predecessor's Lease for its own."""
    host = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:10]}"
