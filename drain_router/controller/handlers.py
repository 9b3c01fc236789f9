"""The kopf registrations: the staged deletion (``on.delete``) and one daemon per ModelService with rules.

The staged deletion is an ``on.delete`` handler (:mod:`drain_router.controller.passes.deleting`). Recycling and
lifecycle rules are one ``@kopf.daemon`` per ModelService that has either
(:mod:`drain_router.controller.daemon`). With ``--activator-service``, an ``on.event`` handler wakes
that daemon as soon as the activator asks for a wake (``status.lifecycle.wakeRequestedAt``).

Handlers are registered on a registry passed in (never kopf's global one), so every operator run,
including the ones tests start and stop, gets its own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import kopf

from drain_router import kubelogin
from drain_router.controller import context, crd, daemon
from drain_router.controller import status as status_
from drain_router.controller.passes import deleting
from drain_router.decisions import activation

PREFIX = "drainrouter.dev"
HANDLER_ID = "staged_delete"
DAEMON_ID = "recycle_and_lifecycle"
WAKE_ID = "wake_requested"


class _QuietRequeue(logging.Filter):
    """kopf logs every TemporaryError at ERROR. Our requeues are the normal way a staged deletion
    waits, so they are logged at DEBUG instead.

    kopf logs the error from inside its ``except TemporaryError`` block and passes neither
    ``exc_info`` nor arguments, but a logger's filters run synchronously in that call, so the
    exception being handled is the :class:`deleting.Requeue` itself: the filter matches our own type,
    never kopf's wording."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and isinstance(sys.exc_info()[1], deleting.Requeue):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def register(registry: kopf.OperatorRegistry, ctx: context.Context) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = ctx.settings.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=PREFIX, key="last-handled-configuration"
        )
        settings.posting.loggers = False  # only the events we post on purpose, not log lines
        # Namespaces are exact names (or the whole cluster): no namespace or CRD watching at runtime,
        # so the RBAC needs no cluster-wide list on namespaces or CRDs.
        settings.scanning.disabled = True
        logging.getLogger("kopf.objects").addFilter(_QuietRequeue())

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if ctx.connection is not None:
            return ctx.connection
        return in_cluster_address(kopf.login_with_service_account(**kwargs)) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.delete(crd.group(), crd.version(), crd.plural(), id=HANDLER_ID, registry=registry)
    async def staged_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await deleting.run_pass(ctx, body, logger)

    @kopf.daemon(
        crd.group(),
        crd.version(),
        crd.plural(),
        id=DAEMON_ID,
        registry=registry,
        cancellation_timeout=10.0,
        when=has_rules,
    )
    async def recycle_and_lifecycle(
        stopped: kopf.DaemonStopped, body: kopf.Body, logger: kopf.Logger, **_: Any
    ) -> None:
        await daemon.service_loop(ctx, body["metadata"]["namespace"], body["metadata"]["name"], stopped, logger)

    if ctx.settings.activator_service is not None:

        @kopf.on.event(crd.group(), crd.version(), crd.plural(), id=WAKE_ID, registry=registry, when=wake_asked)
        async def wake_requested(body: kopf.Body, **_: Any) -> None:
            """The activator wrote ``status.lifecycle.wakeRequestedAt``: the daemon's next pass now,
            not at its requeue time."""
            ctx.nudge(body["metadata"]["namespace"], body["metadata"]["name"])


def in_cluster_address(
    info: kopf.ConnectionInfo | None, environ: Mapping[str, str] = os.environ
) -> kopf.ConnectionInfo | None:
    """kopf's service-account login, with the API server where client-go's in-cluster config finds
    it: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` (the kubelet sets both in every
    pod), not kopf's ``https://kubernetes.default.svc``.

    Why: the Lease and every write of our own client go to that address (kubernetes_asyncio's
    in-cluster loader), while kopf's watches would need the cluster's DNS to name it. A replica
    whose DNS fails (DNS pods down, a pod on the host's resolver) would then hold the Lease and act on
    nothing. Unchanged outside a cluster (no ``KUBERNETES_SERVICE_HOST``)."""
    server = kubelogin.in_cluster_server(environ)
    if info is None or server is None:
        return info
    return dataclasses.replace(info, server=server)


def wake_asked(status: Mapping[str, Any], **_: Any) -> bool:
    """A wake is pending and the service is not waking yet (a waking service's passes already look
    every requeue; nudging them on every status write would only repeat them)."""
    record = status_.activation_status((status or {}).get("lifecycle"))
    return record.wake_pending and record.phase is not activation.Phase.WAKING


def has_rules(spec: Mapping[str, Any], **_: Any) -> bool:
    """The daemon runs only for ModelServices with ``spec.recycling`` or ``spec.lifecycle``."""
    return spec.get("recycling") is not None or spec.get("lifecycle") is not None
