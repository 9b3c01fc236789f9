"""Shared fixtures: the fake model server (the fake model's testing kit) and routers running in the
test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from drain_router import config
from drain_router.runtime import lifecycle
from drain_router_dev.fake_model import testing as fake_model_testing


class RunningRouter:
    def __init__(self, router: lifecycle.Router, task: asyncio.Task[int]) -> None:
        self.router = router
        self.task = task

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.router.admin_port}"

    @property
    def state(self) -> Any:
        return self.router.state

    def sigterm(self) -> None:
        self.router.handle_exit(15)

    async def exit_code(self, timeout: float = 10.0) -> int:
        return await asyncio.wait_for(asyncio.shield(self.task), timeout)


@pytest.fixture
async def fake_upstream() -> AsyncIterator[fake_model_testing.FakeModel]:
    """The fake model server in this test's loop: ``.url``, its counters, ``.healthy`` to flip."""
    async with fake_model_testing.running() as fake:
        yield fake


@pytest.fixture
async def start_router() -> AsyncIterator[Callable[..., Awaitable[RunningRouter]]]:
    """Factory: ``await start_router(upstream=..., shutdown_drain_secs=1, ...)``; cleaned up after."""
    started: list[RunningRouter] = []

    async def start(**overrides: Any) -> RunningRouter:
        params: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": 0,
            "admin_host": "127.0.0.1",
            "admin_port": 0,
            "shutdown_drain_secs": 1,
        }
        params.update(overrides)
        router = lifecycle.Router(config.build_config(**params), registry=CollectorRegistry())
        task = asyncio.ensure_future(router.run(install_signals=False))
        started_wait = asyncio.ensure_future(router.started.wait())
        done, _ = await asyncio.wait([task, started_wait], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if started_wait not in done:
            started_wait.cancel()
            raise AssertionError(f"router did not start: {task.result() if task.done() else 'timeout'}")
        running = RunningRouter(router, task)
        started.append(running)
        return running

    yield start
    for running in started:
        if not running.task.done():
            running.router.handle_exit(2)
            running.router.handle_exit(2)
        try:
            await asyncio.wait_for(running.task, 10)
        except Exception:
            pass


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
