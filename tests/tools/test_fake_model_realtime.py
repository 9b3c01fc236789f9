"""The fake model's ``/v1/realtime`` WebSocket endpoint, through aiohttp's WebSocket client."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from drain_router_dev import fake_model
from drain_router_dev.fake_model import serve, testing
from drain_router_dev.fake_model import state as fake_state
from drain_router_dev.process import wait_until

Client = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def client(aiohttp_client: Client) -> TestClient:
    return await aiohttp_client(
        fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=1)), server_kwargs={"handler_cancellation": True}
    )


def _state(client: TestClient) -> fake_state.State:
    assert client.app is not None
    return client.app[fake_state.STATE]


async def _event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive(timeout=5)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event = json.loads(msg.data)
    assert isinstance(event, dict)
    return event


async def _response(ws: aiohttp.ClientWebSocketResponse, **response: Any) -> list[dict[str, Any]]:
    """Send one ``response.create`` and read its events up to ``response.done``."""
    await ws.send_json({"type": "response.create", "response": response})
    events = [await _event(ws)]
    while events[-1]["type"] not in ("response.done", "error"):
        events.append(await _event(ws))
    return events


async def test_session_created_then_numbered_deltas_then_done(client: TestClient) -> None:
    async with client.ws_connect("/v1/realtime") as ws:
        created = await _event(ws)
        assert created["type"] == "session.created"
        assert created["session"]["model"] == "fake-model"
        assert created["server"] == os.getpid()
        events = await _response(ws)
        assert [e["type"] for e in events] == ["response.created", *["response.text.delta"] * 3, "response.done"]
        deltas = events[1:-1]
        assert [d["seq"] for d in deltas] == [0, 1, 2]
        assert {d["total"] for d in deltas} == {3}
        assert "".join(d["delta"] for d in deltas) == " tok0 tok1 tok2"
        rid = events[0]["response"]["id"]
        assert {d["response_id"] for d in deltas} == {rid}
        assert events[-1]["response"] == {
            "id": rid,
            "object": "realtime.response",
            "status": "completed",
            "usage": {"input_tokens": 0, "output_tokens": 3, "total_tokens": 3},
        }
        ids = [created["event_id"], *(e["event_id"] for e in events)]
        assert len(set(ids)) == len(ids)
        # The session stays open for the next response.
        assert len(await _response(ws, deltas=1)) == 3


@pytest.mark.parametrize(
    ("response", "deltas"),
    [
        pytest.param({"deltas": 5}, 5, id="deltas"),
        pytest.param({"max_output_tokens": 4}, 4, id="max-output-tokens"),
        pytest.param({"deltas": 0}, 0, id="zero"),
        pytest.param({}, 3, id="server-default"),
    ],
)
async def test_deltas_per_response(client: TestClient, response: dict[str, Any], deltas: int) -> None:
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        events = await _response(ws, **response)
    assert sum(1 for e in events if e["type"] == "response.text.delta") == deltas


async def test_interval_paces_the_deltas(client: TestClient) -> None:
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        started = time.monotonic()
        await _response(ws, deltas=4, interval_ms=50)
    assert time.monotonic() - started >= 0.15  # three gaps of 50 ms


async def test_server_default_pace(aiohttp_client: Client) -> None:
    client = await aiohttp_client(fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=60)))
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        started = time.monotonic()
        await _response(ws)
    assert time.monotonic() - started >= 0.12


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        pytest.param("{nope", "invalid_json", id="not-json"),
        pytest.param('["response.create"]', "invalid_event", id="not-an-object"),
        pytest.param('{"type": "conversation.nope"}', "unknown_event", id="unknown-type"),
        pytest.param('{"type": "response.create", "response": {"deltas": -1}}', "invalid_value", id="negative"),
        pytest.param('{"type": "response.create", "response": {"deltas": true}}', "invalid_value", id="bool"),
        pytest.param('{"type": "response.create", "response": 3}', "invalid_event", id="response-not-object"),
    ],
)
async def test_bad_events_get_an_error_and_the_session_stays(client: TestClient, sent: str, code: str) -> None:
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        await ws.send_str(sent)
        error = await _event(ws)
        assert (error["type"], error["error"]["code"]) == ("error", code)
        assert (await _response(ws, deltas=1))[-1]["type"] == "response.done"


async def test_one_response_at_a_time(client: TestClient) -> None:
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        await ws.send_json({"type": "response.create", "response": {"deltas": 50, "interval_ms": 20}})
        assert (await _event(ws))["type"] == "response.created"
        await ws.send_json({"type": "response.create"})
        seen = [await _event(ws) for _ in range(3)]
        errors = [e for e in seen if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["conversation_already_has_active_response"]


async def test_ping_is_answered(client: TestClient) -> None:
    async with client.ws_connect("/v1/realtime", autoping=False) as ws:
        await _event(ws)
        await ws.ping(b"are you there")
        msg = await ws.receive(timeout=5)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.PONG, b"are you there")


@pytest.mark.parametrize("code", [1000, 1001, 4000])
async def test_client_close_code_is_recorded(client: TestClient, code: int) -> None:
    """1. a session opens 2. the client closes it with ``code``. Result: the server answers the
    Close, counts the session closed by the client with that code, and none is open."""
    async with client.ws_connect("/v1/realtime") as ws:
        await _event(ws)
        await ws.close(code=code)
    await wait_until(lambda: not _state(client).sessions, 5, "the session to end")
    assert dict(_state(client).session_ends) == {f"client_{code}": 1}


async def test_client_that_vanishes_is_abnormal(client: TestClient) -> None:
    ws = await client.ws_connect("/v1/realtime")
    await _event(ws)
    await ws.send_json({"type": "response.create", "response": {"deltas": 1000, "interval_ms": 10}})
    assert (await _event(ws))["type"] == "response.created"
    ws._response.connection.transport.abort()  # type: ignore[union-attr]  # no Close frame: a crash
    await wait_until(lambda: not _state(client).sessions, 5, "the session to end")
    assert dict(_state(client).session_ends) == {"abnormal": 1}
    await ws.close()


async def test_stats_count_open_sessions(client: TestClient) -> None:
    async def stats() -> dict[str, int]:
        async with client.get("/stats") as resp:
            return dict(await resp.json())

    first = await client.ws_connect("/v1/realtime")
    second = await client.ws_connect("/v1/realtime")
    await _event(first)
    await _event(second)
    got = await stats()
    assert (got["sessions"], got["sessions_opened"], got["sessions_closed"]) == (2, 2, 0)
    await first.close()
    await wait_until(lambda: len(_state(client).sessions) == 1, 5, "one session left")
    got = await stats()
    assert (got["sessions"], got["sessions_opened"], got["sessions_closed"]) == (1, 2, 1)
    assert got["started"] == 0, "a session is not a completion"
    await second.close()


async def test_plain_get_is_400(client: TestClient) -> None:
    async with client.get("/v1/realtime") as resp:
        assert resp.status == 400


# -- shutdown: the sessions open at the deadline end with 1001 ---------------------------------------


@pytest.fixture
async def served() -> AsyncIterator[tuple[web.AppRunner, fake_state.State, str]]:
    state = fake_state.State()
    runner = web.AppRunner(
        fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=1), state),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=1,
    )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner, state, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/realtime"
    await runner.cleanup()


@pytest.mark.parametrize("timeout", [0.0, 0.3], ids=["at-once", "at-the-deadline"])
async def test_shutdown_closes_open_sessions_with_1001(
    served: tuple[web.AppRunner, fake_state.State, str], timeout: float
) -> None:
    """1. two sessions are open, one in the middle of a response 2. shut_down(timeout). Result: at
    the deadline both receive a Close 1001 (Going Away), not a cut connection; counted server_1001."""
    runner, state, url = served
    async with aiohttp.ClientSession() as session:
        sockets = [await session.ws_connect(url) for _ in range(2)]
        for ws in sockets:
            await _event(ws)
        await sockets[0].send_json({"type": "response.create", "response": {"deltas": 1000, "interval_ms": 10}})

        async def until_closed(ws: aiohttp.ClientWebSocketResponse) -> tuple[aiohttp.WSMsgType, int | None]:
            msg = await ws.receive(timeout=5)
            while msg.type is aiohttp.WSMsgType.TEXT:  # the deltas sent before the Close
                msg = await ws.receive(timeout=5)
            return msg.type, ws.close_code

        readers = [asyncio.create_task(until_closed(ws)) for ws in sockets]
        started = time.monotonic()
        await serve.shut_down(runner, state, timeout)
        assert timeout <= time.monotonic() - started < timeout + 1.0
        assert await asyncio.gather(*readers) == [(aiohttp.WSMsgType.CLOSE, 1001)] * 2
    assert dict(state.session_ends) == {"server_1001": 2}
    assert not state.sessions


async def test_testing_kit_closes_sessions_with_1001() -> None:
    async with aiohttp.ClientSession() as session:
        async with testing.running() as model:
            ws = await session.ws_connect(model.url + "/v1/realtime")
            await _event(ws)
            closing = asyncio.create_task(ws.receive(timeout=5))  # reading, as a live client is
        msg = await closing
        assert (msg.type, ws.close_code) == (aiohttp.WSMsgType.CLOSE, 1001)
