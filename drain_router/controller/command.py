"""``drain-router controller``: flags -> :class:`ControllerSettings` -> run. kopf is imported only
inside the command body, so ``drain-router --help`` and the sidecar never load it."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import click

from drain_router.config import flags, usage
from drain_router.controller import crd
from drain_router.controller import settings as settings_


@click.command(
    "controller",
    cls=usage.SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@flags.settings_options(settings_.ControllerSettings, command="controller")
@click.option("--print-crd", is_flag=True, help="Print the ModelService CRD (what the chart ships) and exit.")
def command(print_crd: bool, **given: Any) -> None:
    """Run the companion controller: staged deletion of ModelServices (needs the 'controller' extra)."""
    if print_crd:
        click.echo(crd.text(), nl=False)
        return
    given["lease_namespace"] = given["lease_namespace"] or own_namespace() or _single(given["namespaces"])
    try:
        cfg = settings_.ControllerSettings(**given, identity=identity())
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

    if cfg.tracing:
        from drain_router import tracing

        try:
            tracing.require()
        except tracing.Unavailable as exc:
            raise MissingExtra(f"--tracing: {exc}") from None
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
