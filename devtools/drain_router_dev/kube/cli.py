"""``drain-router-dev cluster up|down``: the test cluster in the background (``make cluster``)."""

from __future__ import annotations

from pathlib import Path

import click

from drain_router_dev.kube import control_plane


@click.group("cluster")
def command() -> None:
    """A real Kubernetes control plane on this machine (root; builds its binaries the first time,
    minutes, then cached), with a stand-in node agent that runs pods as local processes."""


@command.command("up")
@click.option("--dir", "root", type=click.Path(path_type=Path), default=Path(".cluster"), show_default=True,
              help="State: certificates, kubeconfigs (kubeconfig is the admin's), logs, pid files.")  # fmt: skip
def up(root: Path) -> None:
    """Start the cluster in the background and wait until its API server is ready."""
    try:
        cluster = control_plane.up(root)
    except control_plane.ClusterFailed as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"API server {cluster.server}; admin kubeconfig {cluster.kubeconfig}")
    click.echo(f"  export KUBECONFIG={cluster.kubeconfig}    stop it with: make cluster-down")


@command.command("down")
@click.option("--dir", "root", type=click.Path(path_type=Path), default=Path(".cluster"), show_default=True)
def down(root: Path) -> None:
    """Stop everything ``up`` started and remove the node's network."""
    control_plane.down(root)
