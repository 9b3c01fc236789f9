"""What the controller's handlers and daemon share for one operator run, and kopf's view of a body."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, cast

import aiohttp
import kopf

from drain_router import tracing
from drain_router.controller import metrics as metrics_
from drain_router.controller import settings as settings_
from drain_router.controller.kube import client as kube_
from drain_router.decisions import deletion, objects, ownership, spans


def body(obj: Mapping[str, Any]) -> kopf.Body:
    """A resource as kopf's event API types it (it reads only ``metadata`` and ``kind``)."""
    return cast(kopf.Body, obj)


def post(obj: Mapping[str, Any], event: objects.Event) -> None:
    """Post a decision's event on ``obj`` (kopf posts it in the background)."""
    kopf.event(body(obj), type=event.type, reason=str(event.reason), message=event.message)


def warn_not_owned(ctx: Context, obj: Mapping[str, Any], refused: Iterable[ownership.NotOwned], logger: Any) -> None:
    """A Warning ``NotOwned`` on the ModelService for each object it names (or pod it selects) that
    is not its own, once per object and reason in this run; every pass logs them."""
    uid = (obj.get("metadata") or {}).get("uid", "")
    for item in refused:
        logger.info(f"left alone, not owned by this service: {item}")
        key = (uid, NOT_OWNED, str(item))
        if key not in ctx.warned:
            ctx.warned.add(key)
            post(obj, objects.Event(type="Warning", reason=NOT_OWNED, message=f"left alone: {item}"))


NOT_OWNED = "NotOwned"
"""The Warning's reason: a named object, or a selected pod, that the ModelService does not own."""


@dataclasses.dataclass(kw_only=True)
class Context:
    """What the handlers share for one operator run."""

    settings: settings_.ControllerSettings
    kube: kube_.Kube
    metrics: metrics_.ControllerMetrics
    connection: kopf.ConnectionInfo | None = None
    """Credentials for kopf's own client; ``None``: kopf's in-cluster / kubeconfig login."""
    clock: Callable[[], float] = time.time
    """Wall clock (Unix seconds): status timestamps must survive a restart on another machine."""
    warned: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    """(uid, key, value) of invalid knobs already warned about, so a 5 s requeue does not repeat them."""
    failed_actions: dict[str, tuple[deletion.ApiFailure, ...]] = dataclasses.field(default_factory=dict)
    """uid -> the actions of its last pass that failed, fed to the next pass as observations (lost on
    a restart: the next pass then tries again and fails again, which is observed the same way)."""
    session: aiohttp.ClientSession | None = None
    """The idle probe's HTTP client (one per run; ``None``: the daemon opens its own)."""
    invalid_rules_warned: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    """(uid, generation) already warned about with ``InvalidLifecycleRules``: once per spec generation."""
    tracer: tracing.Tracer | None = None
    """``--tracing``: the passes' tracer; None when off (the SDK is never loaded)."""
    wakeups: dict[tuple[str, str], asyncio.Event] = dataclasses.field(default_factory=dict)
    """(namespace, name) -> set when a wake was asked for: the ModelService's daemon sleeps until its
    requeue time or this, whichever comes first."""

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def nudge(self, namespace: str, name: str) -> None:
        """Run the ModelService's next pass now (a wake was asked for)."""
        self.wakeup(namespace, name).set()

    def span(self, name: str, obj: Mapping[str, Any]) -> AbstractContextManager[tracing.Span | None]:
        """An INTERNAL span around one pass over the ModelService ``obj`` (named by its attributes),
        or nothing with tracing off."""
        if self.tracer is None:
            return contextlib.nullcontext()
        meta = obj.get("metadata") or {}
        return self.tracer.internal(name, spans.modelservice(meta.get("namespace"), meta.get("name"), meta.get("uid")))
