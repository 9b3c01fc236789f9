"""Fixtures for the controller tests: the emulated API server, a simulated kubelet, and the real kopf
operator started in this process (and stoppable, for the restart test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import kmock
import pytest
from kubernetes_asyncio import client

from drain_router.controller import context, crd
from drain_router.controller import settings as settings_
from drain_router_dev import process as process_
from tests.chart import conftest as chart_fixtures
from tests.chart import helm as chart

from . import ownership_audit
from .emulator import ClusterEmulator, Rule, rules_of

NAMESPACE = "ns"
MSVC = f"{crd.group()}/{crd.version()}/{crd.plural()}"
REQUEUE = 0.2

T = TypeVar("T")


async def eventually(check: Callable[[], T], *, timeout: float = 30.0, what: str) -> T:
    """:func:`~drain_router_dev.process.wait_until` with this suite's default: 30 s, room for many of
    the operator's passes (``REQUEUE`` apart) on a loaded machine."""
    return await process_.wait_until(check, timeout, what)


RBAC_ENV = "CONTROLLER_TEST_RBAC"
"""``CONTROLLER_TEST_RBAC=1``: every emulated cluster allows only what the chart's rendered Role and
ClusterRole grant (the whole controller suite passes in RBAC mode)."""


helm = chart_fixtures.helm
"""The chart tests' session fixture (a pinned helm binary), reused here."""


@pytest.fixture(scope="session")
def chart_rules(helm: chart.Helm) -> list[Rule]:
    """The controller's RBAC as the controller chart renders it with every feature the suite exercises
    (cluster mode, so the node reads are granted too; the activator, so its EndpointSlices may be
    written: the activator's own rules are granted too, since the emulator does not tell its calls from the controller's)."""
    docs = helm.template(
        {
            "watch": {"allNamespaces": True},
            "features": {"forceDelete": True, "inferencePools": True},
            "activator": {"enabled": True},
        },
        chart=chart.CONTROLLER_CHART,
    )
    return rules_of(chart.find(docs, "Role") + chart.find(docs, "ClusterRole"))


@pytest.fixture()
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ClusterEmulator, kmock.Server]]:
    emulator = ClusterEmulator()
    if os.environ.get(RBAC_ENV) == "1":
        emulator.rbac = request.getfixturevalue("chart_rules")
    assert emulator.install_crd(crd.load()) == MSVC
    audit = ownership_audit.install(emulator, MSVC) if getattr(request.module, "AUDIT_OWNERSHIP", True) else None
    async with emulator, kmock.Server(emulator) as server:
        loops = [asyncio.create_task(emulator.kubelet()), asyncio.create_task(emulator.controllers())]
        try:
            yield emulator, server
        finally:
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    assert audit is None or not audit.violations, f"writes to objects the service does not own: {audit.violations}"


class Operator:
    """The real operator (kopf + our handlers) in its own thread and event loop, as kopf's own
    ``KopfRunner`` does: on stop, kopf cancels every task of its loop that it did not start with,
    which in the test's loop would include pytest's own. ``stop()`` and ``start()`` again."""

    def __init__(self, server: kmock.Server, **overrides: Any) -> None:
        self.server = server
        self.overrides = overrides
        """ControllerSettings fields on top of the tests' defaults (short waits)."""
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()
        self.ctx: context.Context | None = None
        self.error: BaseException | None = None

    async def start(self) -> None:
        from drain_router.controller import operator

        settings = settings_.ControllerSettings(
            **{"namespaces": (NAMESPACE,), "requeue_secs": REQUEUE, "metrics_port": 0, **self.overrides}
        )
        configuration = client.Configuration(host=str(self.server.url).rstrip("/"))
        self.stop_flag, ready = threading.Event(), threading.Event()

        async def main() -> None:
            async with operator.context(settings, configuration=configuration) as ctx:
                self.ctx = ctx
                await operator.operate(ctx, stop_flag=self.stop_flag, ready_flag=ready)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # reported by stop()
                self.error = exc

        self.thread = threading.Thread(target=run, name="operator", daemon=True)
        self.thread.start()
        await eventually(lambda: ready.is_set() or self.error is not None, what="the operator to be ready")
        if self.error is not None:
            raise self.error

    async def stop(self) -> None:
        if self.thread is not None:
            self.stop_flag.set()
            thread = self.thread
            await eventually(lambda: not thread.is_alive(), what="the operator to stop")
            self.thread = None
        if self.error is not None and not isinstance(self.error, asyncio.CancelledError):
            raise self.error


@pytest.fixture()
async def start_operator(cluster: tuple[ClusterEmulator, kmock.Server]) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await start_operator(recycle_retry_secs=1.0, ...)``; stopped after the test."""
    started: list[Operator] = []

    async def start(**overrides: Any) -> Operator:
        op = Operator(cluster[1], **overrides)
        await op.start()
        started.append(op)
        return op

    try:
        yield start
    finally:
        for op in started:
            await op.stop()


@pytest.fixture()
async def operator(cluster: tuple[ClusterEmulator, kmock.Server]) -> AsyncIterator[Operator]:
    op = Operator(cluster[1])
    await op.start()
    try:
        yield op
    finally:
        await op.stop()
