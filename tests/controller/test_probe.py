"""The idle probe fails closed: every way an answer can be wrong is a failure, never an exception,
and only a 200 with ``inflight == 0``, nothing ``queued`` and ``state == serving`` is idle (an answer
without ``queued``, from a router older than the admission queue, has nothing queued)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from drain_router.controller import probe
from drain_router.decisions import lifecycle

GOOD = {"inflight": 0, "state": "serving", "idle_since": 1700000000.5, "started_at": 1699990000.0, "served": 3}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _serve(aiohttp_server: Callable[..., Awaitable[TestServer]], status: int, body: str) -> TestServer:
    async def inflight(_: web.Request) -> web.Response:
        return web.Response(status=status, text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get(probe.PATH, inflight)
    return await aiohttp_server(app, host="127.0.0.1")


@pytest.mark.parametrize(
    ("status", "body", "idle", "failed"),
    [
        pytest.param(200, GOOD, True, False, id="idle"),
        pytest.param(200, {**GOOD, "inflight": 2}, False, False, id="busy"),
        pytest.param(200, {**GOOD, "state": "draining"}, False, False, id="draining"),
        pytest.param(200, {**GOOD, "state": "starting"}, False, False, id="starting"),
        pytest.param(503, GOOD, False, True, id="non-200"),
        pytest.param(200, "not json", False, True, id="bad-json"),
        pytest.param(200, [1, 2], False, True, id="not-an-object"),
        pytest.param(200, {**GOOD, "inflight": -1}, False, True, id="negative-inflight"),
        pytest.param(200, {**GOOD, "inflight": True}, False, True, id="bool-inflight"),
        pytest.param(200, {k: v for k, v in GOOD.items() if k != "state"}, False, True, id="no-state"),
        pytest.param(200, {k: v for k, v in GOOD.items() if k != "served"}, False, True, id="no-served"),
        pytest.param(200, {**GOOD, "idle_since": "yesterday"}, False, True, id="bad-idle-since"),
        pytest.param(200, {**GOOD, "queued": 0}, True, False, id="nothing-queued"),
        pytest.param(200, {**GOOD, "queued": 3}, False, False, id="requests-queued"),
        pytest.param(200, {**GOOD, "queued": -1}, False, True, id="negative-queued"),
        pytest.param(200, {**GOOD, "queued": "3"}, False, True, id="text-queued"),
        pytest.param(200, {**GOOD, "queued": None}, False, True, id="null-queued"),
    ],
)
async def test_answers(
    aiohttp_server: Any, session: aiohttp.ClientSession, status: int, body: Any, idle: bool, failed: bool
) -> None:
    server = await _serve(aiohttp_server, status, body if isinstance(body, str) else json.dumps(body))
    answer = await probe.probe(session, "127.0.0.1", server.port)
    result = probe.for_recycling(answer, "uid-a")
    assert (result.idle, result.failed) == (idle, failed), answer
    report = probe.for_lifecycle(answer, "a")
    assert isinstance(report, lifecycle.ProbeFailure) == failed
    if not failed:
        assert report == lifecycle.RouterReport(
            pod="a",
            inflight=body["inflight"],
            queued=body.get("queued", 0),
            idle_since=body["idle_since"],
            served=body["served"],
        )
        clock = lifecycle.idle_clock([report], 1, lifecycle.LifecycleStatus(idle_since=1.0), 1700000001.0)
        busy = body["inflight"] > 0 or body.get("queued", 0) > 0  # the state does not matter here
        assert (clock.idle_since is None) == busy


async def test_timeout_is_a_failure(aiohttp_server: Any, session: aiohttp.ClientSession) -> None:
    never = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        await never.wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get(probe.PATH, hang)
    server = await aiohttp_server(app, host="127.0.0.1")
    answer = await asyncio.wait_for(probe.probe(session, "127.0.0.1", server.port, timeout=0.2), 5)
    assert answer.error is not None and "no answer within 0.2s" in answer.error
    assert probe.for_recycling(answer, "u").failed


async def test_nothing_listening_is_a_failure(session: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port that was free a moment ago and is now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = await probe.probe(session, "127.0.0.1", port)
    assert answer.error is not None and "127.0.0.1" in answer.error
    assert isinstance(probe.for_lifecycle(answer, "a"), lifecycle.ProbeFailure)


@pytest.mark.parametrize("ip", [None, "", "not-an-ip"])
async def test_no_usable_pod_ip_is_a_failure(session: aiohttp.ClientSession, ip: str | None) -> None:
    assert probe.for_recycling(await probe.probe(session, ip, 9091), "u").failed


def test_ipv6_url() -> None:
    assert probe.url("fd00::1", 9091) == "http://[fd00::1]:9091/admin/inflight"


async def test_a_real_router_answers_idle_with_served(
    start_router: Any, fake_upstream: Any, session: aiohttp.ClientSession
) -> None:
    router = await start_router(upstream=fake_upstream.url)
    async with session.get(router.url + "/short") as response:
        await response.read()
    answer = await probe.probe(session, "127.0.0.1", router.router.admin_port)
    assert probe.for_recycling(answer, "u").idle, answer
    report = probe.for_lifecycle(answer, "a")
    assert isinstance(report, lifecycle.RouterReport) and report.served == 1 and report.idle_since is not None
