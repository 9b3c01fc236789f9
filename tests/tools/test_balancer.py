"""The demo's probe-driven balancer: rotation by probes, round robin, no retries, honest cuts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from drain_router_dev import balancer, fake_model, load, realtime, sessions, streams
from drain_router_dev.fake_model import app as fake_app
from drain_router_dev.fake_model import state as fake_state
from drain_router_dev.process import wait_until


class Upstream:
    """A backend whose /readyz answer the test sets, in front of the fake model's handlers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = True
        self.app = fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=1))
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/whoami", self._whoami)
        self.app.router.add_get("/closing", self._closing)
        self.app.router.add_get("/die", self._die)
        self.peers: list[int] = []

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.json_response({}, status=200 if self.ready else 503)

    async def _whoami(self, request: web.Request) -> web.Response:
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[1])
        return web.json_response({"name": self.name, "hop": request.headers.get("X-Hop")})

    async def _closing(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.name}, headers={"Connection": "close"})

    async def _die(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"seq": 0}\n\n')
        assert request.transport is not None
        request.transport.abort()
        return response


@pytest.fixture
async def cluster(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AsyncIterator[Any]:
    ups = [Upstream("a"), Upstream("b")]
    servers = [await aiohttp_server(u.app) for u in ups]
    backends = [
        balancer.Backend(u.name, str(s.make_url("")).rstrip("/"), str(s.make_url("/readyz")))
        for u, s in zip(ups, servers)
    ]
    changes: list[tuple[str, bool]] = []
    lb = balancer.Balancer(
        backends, probe_interval=3600, fall=2, rise=1, on_change=lambda b, up: changes.append((b.name, up))
    )
    await lb.start()
    await lb.probe_once()
    async with aiohttp.ClientSession() as session:
        yield lb, ups, session, changes
    await lb.stop()


async def _who(session: aiohttp.ClientSession, lb: balancer.Balancer, path: str = "/whoami") -> Any:
    async with session.get(lb.url + path) as resp:
        return resp.status, await resp.json(), resp.headers.get("Connection")


async def test_round_robin_over_backends_in_rotation(cluster: Any) -> None:
    lb, _ups, session, changes = cluster
    assert changes == [("a", True), ("b", True)]
    names = [(await _who(session, lb))[1]["name"] for _ in range(4)]
    assert sorted(names) == ["a", "a", "b", "b"]


async def test_fall_and_rise(cluster: Any) -> None:
    lb, ups, session, changes = cluster
    ups[0].ready = False
    await lb.probe_once()
    assert lb.backends[0].in_rotation, "one failed probe must not remove it with fall 2"
    await lb.probe_once()
    assert not lb.backends[0].in_rotation
    assert {(await _who(session, lb))[1]["name"] for _ in range(4)} == {"b"}
    ups[0].ready = True
    await lb.probe_once()
    assert changes[-2:] == [("a", False), ("a", True)]


async def test_none_in_rotation_is_503(cluster: Any) -> None:
    lb, ups, session, _ = cluster
    for u in ups:
        u.ready = False
    await lb.probe_once()
    await lb.probe_once()
    async with session.get(lb.url + "/whoami") as resp:
        assert resp.status == 503


async def test_refused_backend_is_502_without_retry(cluster: Any) -> None:
    lb, _, session, _ = cluster
    lb.backends[0].url = "http://127.0.0.1:1"  # nothing listens there; the probe still says ready
    statuses = sorted([(await _who(session, lb))[0] for _ in range(2)])
    assert statuses == [200, 502]


async def test_streams_pass_through_whole(cluster: Any) -> None:
    lb, _, session, _ = cluster
    result = await load.stream_completion(session, lb.url, chunks=5, interval_ms=1)
    assert streams.classify(result) is streams.Outcome.OK


async def test_backend_dying_mid_stream_cuts_the_client(cluster: Any) -> None:
    lb, _, session, _ = cluster
    with pytest.raises(aiohttp.ClientPayloadError):
        async with session.get(lb.url + "/die") as resp:
            assert resp.status == 200
            await resp.read()


async def test_connection_close_is_hop_by_hop_and_pool_is_kept(cluster: Any) -> None:
    lb, ups, session, _ = cluster
    status, _, connection = await _who(session, lb, "/closing")
    assert status == 200 and connection != "close"
    for _ in range(6):
        await _who(session, lb)
    # Six requests over two backends came over at most one pooled connection each.
    assert len(set(ups[0].peers)) == 1 and len(set(ups[1].peers)) == 1


async def test_hop_by_hop_request_headers_dropped(cluster: Any) -> None:
    lb, _, session, _ = cluster
    async with session.get(lb.url + "/whoami", headers={"Connection": "X-Hop", "X-Hop": "1"}) as resp:
        assert (await resp.json())["hop"] is None


# -- WebSocket: realtime sessions relayed with their Close codes -----------------------------------


async def test_websocket_session_relayed_and_closed_by_the_client(cluster: Any) -> None:
    lb, _ups, session, _ = cluster
    stop = asyncio.Event()
    stop.set()  # one response, then the client closes with 1000
    result, tally = await realtime.run_session(session, lb.url, deltas=3, interval_ms=1, stop=stop)
    assert sessions.classify(result) is sessions.End.NORMAL, result
    assert (tally.server, tally.problem) == (os.getpid(), None)


@pytest.mark.parametrize("how", ["going-away", "vanished"])
async def test_websocket_end_from_the_backend_reaches_the_client(cluster: Any, how: str) -> None:
    """1. a session through the balancer, a response in progress 2. its backend closes it with
    1001, or vanishes (its handler dies, no Close). Result: the client sees 1001, or 1006."""
    lb, ups, session, _ = cluster
    holder = asyncio.create_task(
        realtime.run_session(session, lb.url, deltas=100_000, interval_ms=5, stop=asyncio.Event())
    )
    states = [u.app[fake_state.STATE] for u in ups]

    await wait_until(lambda: any(s.sessions for s in states), 5, "the session to reach a backend")
    state = next(s for s in states if s.sessions)
    if how == "going-away":
        await fake_app.close_sessions(state)
    else:
        for task in state.sessions.values():
            task.cancel()
    result, _ = await asyncio.wait_for(holder, 10)
    expected = sessions.End.GOING_AWAY if how == "going-away" else sessions.End.ABNORMAL
    assert sessions.classify(result) is expected, result


async def test_websocket_refused_by_the_backend_keeps_its_status(aiohttp_server: Any) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": "upgrade_not_supported"}, status=501)

    app = web.Application()
    app.router.add_get("/v1/realtime", refuse)
    app.router.add_get("/readyz", _ok)
    server = await aiohttp_server(app)
    lb = balancer.Balancer(
        [balancer.Backend("a", str(server.make_url("")).rstrip("/"), str(server.make_url("/readyz")))]
    )
    await lb.start()
    try:
        await lb.probe_once()
        async with aiohttp.ClientSession() as session:
            assert await realtime.handshake_status(session, lb.url) == 501
    finally:
        await lb.stop()


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})
