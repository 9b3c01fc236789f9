"""Fixtures of the tracing tests: a real OTLP/HTTP receiver (tests/otlp.py) and real router processes
exporting to it with the real SDK and exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests import otlp, rawupstream
from tests.process import RouterProcess

StartTraced = Callable[..., Awaitable[RouterProcess]]


@pytest.fixture
async def receiver() -> AsyncIterator[otlp.Receiver]:
    async with otlp.running() as r:
        yield r


@pytest.fixture
async def raw_upstream() -> AsyncIterator[rawupstream.RawUpstream]:
    async with rawupstream.running() as up:
        yield up


@pytest.fixture
async def start_traced(receiver: otlp.Receiver) -> AsyncIterator[StartTraced]:
    """Factory of routers exporting to ``receiver`` (``--tracing`` unless ``tracing=False``; ``env``:
    more OTEL_* variables), each waited for until listening, all killed on exit."""
    started: list[RouterProcess] = []

    async def start(
        upstream: str, *args: str, tracing: bool = True, drain_secs: str = "0", env: dict[str, str] | None = None
    ) -> RouterProcess:
        p = await RouterProcess.start(
            "--upstream",
            upstream,
            "--shutdown-drain-secs",
            drain_secs,
            "--tracing" if tracing else "--no-tracing",
            *args,
            env=otlp.environment(receiver.endpoint, **(env or {})),
        )
        started.append(p)
        await p.wait_event("startup.listening")
        return p

    yield start
    for p in started:
        await p.kill()
