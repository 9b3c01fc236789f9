"""The realtime load's client, against the fake model's testing kit and small servers in this loop."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from drain_router_dev import realtime, sessions
from drain_router_dev.fake_model import app as fake_app
from drain_router_dev.fake_model import openai, serve, testing
from drain_router_dev.fake_model import state as fake_state
from drain_router_dev.process import free_port, wait_until


@pytest.fixture
async def small_server() -> AsyncIterator[
    Callable[[Callable[[web.Request], Awaitable[web.StreamResponse]]], Awaitable[str]]
]:
    """``await small_server(handler)``: ``handler`` on ``/v1/realtime`` of a loopback server; its URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> str:
        app = web.Application()
        app.router.add_get(realtime.PATH, handler)
        runner = web.AppRunner(app, access_log=None)
        runners.append(runner)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_sessions_exchange_until_stopped_then_close_1000() -> None:
    """1. two clients hold sessions and keep asking for responses 2. both are in a response
    3. stop. Result: every session ended with a Close 1000 the client sent, after whole responses,
    on this server; none unclean; the server saw every session closed by its client with 1000."""
    async with testing.running() as model:
        load = realtime.Sessions(model.url, clients=2, deltas=3, interval_ms=1)
        await load.start()
        try:
            await wait_until(lambda: load.open == 2, 5, "two sessions open")
            await wait_until(
                lambda: sum(s.responding is not None for s in model.sessions) == 2, 5, "two responses asked for"
            )
        finally:
            records = await load.stop()
        await wait_until(lambda: not model.sessions, 5, "the server to see both sessions end")
    assert len(records) == 2
    assert {(r.end, r.result.client_closed, r.server) for r in records} == {(sessions.End.NORMAL, True, os.getpid())}
    assert all(r.responses >= 1 for r in records)
    assert not load.unclean
    assert dict(model.session_ends) == {"client_1000": 2}
    assert load.open == 0


async def test_sessions_close_after_max_responses_and_reopen() -> None:
    """1. one client whose sessions close after 2 responses 2. three sessions have ended. Result:
    each ended with the client's Close 1000 after exactly 2 whole responses, and the client opened
    the next at once (the chaos run spreads sessions over the pods so)."""
    async with testing.running() as model:
        load = realtime.Sessions(model.url, clients=1, deltas=2, interval_ms=1, max_responses=2)
        await load.start()
        try:
            await wait_until(lambda: len(load.records) >= 3, 5, "three sessions ended")
        finally:
            records = await load.stop()
    done = records[:3]
    assert [(r.end, r.result.client_closed, r.responses) for r in done] == [(sessions.End.NORMAL, True, 2)] * 3
    assert not load.unclean


async def test_going_away_then_reconnect() -> None:
    """1. two clients hold sessions, responses in progress 2. the model server shuts down (vLLM's
    timeout 0: at once). Result: both sessions end going_away (1001), clean; each client
    reconnects at once (its next attempt is refused: nothing listens any more)."""
    state = fake_state.State()
    runner = web.AppRunner(fake_app.make_app(openai.Settings(), state), handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    load = realtime.Sessions(f"http://127.0.0.1:{port}", clients=2, deltas=1000, interval_ms=10)
    await load.start()
    try:
        await wait_until(lambda: len(state.sessions) == 2, 5, "two sessions open")
        await serve.shut_down(runner, state, 0)
        await wait_until(lambda: len(load.records) >= 4, 5, "both clients to try again")
    finally:
        records = await load.stop()
    by_worker = {w: [r.end for r in records if r.worker == w] for w in (0, 1)}
    for ends in by_worker.values():
        assert ends[0] is sessions.End.GOING_AWAY, ends
        assert ends[1] is sessions.End.REFUSED, ends
    assert [r.result.close_code for r in records if r.end is sessions.End.GOING_AWAY] == [1001, 1001]


async def test_a_cut_connection_is_abnormal(small_server: Callable[..., Awaitable[str]]) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"type": "session.created", "server": 1}))
        await ws.receive()  # the client's response.create
        assert request.transport is not None
        request.transport.abort()  # no Close frame: a reset, as a cut tunnel
        return ws

    url = await small_server(cut)
    async with aiohttp.ClientSession() as session:
        result, tally = await realtime.run_session(session, url, deltas=3, interval_ms=1, stop=asyncio.Event())
    assert sessions.classify(result) is sessions.End.ABNORMAL, result
    assert (result.close_code, tally.server) == (1006, 1)


async def test_wrong_events_end_the_session(small_server: Callable[..., Awaitable[str]]) -> None:
    async def skipping(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"type": "session.created", "server": 1}))
        await ws.receive()
        for event in ({"type": "response.created"}, {"type": "response.text.delta", "seq": 1, "total": 3}):
            await ws.send_str(json.dumps(event))
        await ws.receive()  # the client's Close
        return ws

    url = await small_server(skipping)
    async with aiohttp.ClientSession() as session:
        result, _ = await realtime.run_session(session, url, deltas=3, interval_ms=1, stop=asyncio.Event())
    assert sessions.classify(result) is sessions.End.BAD_EVENTS
    assert result.problem == "delta 1 where 0 was due"


async def test_handshake_status(small_server: Callable[..., Awaitable[str]]) -> None:
    async def not_implemented(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": "upgrade_not_supported"}, status=501)

    refusing = await small_server(not_implemented)
    async with testing.running() as model, aiohttp.ClientSession() as session:
        assert await realtime.handshake_status(session, model.url) == 101
        assert await realtime.handshake_status(session, refusing) == 501
        assert await realtime.handshake_status(session, f"http://127.0.0.1:{free_port()}") is None
        result, _ = await realtime.run_session(session, refusing, deltas=1, interval_ms=1, stop=asyncio.Event())
    assert (result.handshake_status, sessions.classify(result)) == (501, sessions.End.REJECTED)
