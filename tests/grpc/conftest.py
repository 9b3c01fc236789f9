"""Fixtures of the gRPC listener's tests: the test upstream (tests/grpcupstream.py) and real router
processes with ``--grpc-port`` in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import grpcupstream
from tests.process import RouterProcess, router_starter

StartGrpcRouter = Callable[..., Awaitable[RouterProcess]]


@pytest.fixture
async def upstream() -> AsyncIterator[grpcupstream.Upstream]:
    async with grpcupstream.running() as up:
        yield up


@pytest.fixture
async def grpc_router(upstream: grpcupstream.Upstream) -> AsyncIterator[StartGrpcRouter]:
    """Factory of routers whose gRPC listener relays to ``upstream`` (the HTTP upstream is unused)."""
    async with router_starter("http://127.0.0.1:9") as start:

        async def start_grpc(*args: str, drain_secs: str = "0", grpc_upstream: str | None = None) -> RouterProcess:
            target = grpc_upstream or f"http://127.0.0.1:{upstream.port}"
            return await start("--grpc-port", "0", "--grpc-upstream", target, *args, drain_secs=drain_secs)

        yield start_grpc


async def admin_json(router: RouterProcess, path: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{router.admin_port}{path}") as resp:
        return await resp.json()


async def inflight(router: RouterProcess) -> int:
    return int((await admin_json(router, "/admin/inflight"))["inflight"])


async def grpc_requests(router: RouterProcess) -> dict[tuple[str, str], float]:
    """``drain_router_grpc_requests_total`` by (grpc_status, outcome)."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{router.admin_port}/metrics") as resp:
        text = await resp.text()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "drain_router_grpc_requests_total":
                out[(sample.labels["grpc_status"], sample.labels["outcome"])] = sample.value
    return out
