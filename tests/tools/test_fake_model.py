"""The stand-in model server: OpenAI shapes, numbered chunks, overrides, counters, disconnects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from click.testing import CliRunner

from drain_router_dev import fake_model, streams
from drain_router_dev.fake_model import serve
from drain_router_dev.fake_model import state as fake_state
from drain_router_dev.process import wait_until

Client = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def client(aiohttp_client: Client) -> TestClient:
    return await aiohttp_client(
        fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=1)), server_kwargs={"handler_cancellation": True}
    )


async def _stream(client: TestClient, path: str, body: dict[str, Any], **kw: Any) -> tuple[int, list[str]]:
    async with client.post(path, json=body, **kw) as resp:
        decoder = streams.SSEDecoder()
        events: list[str] = []
        async for data in resp.content.iter_any():
            events.extend(decoder.feed(data))
        return resp.status, events


async def test_completion_stream_is_numbered_and_ends_done(client: TestClient) -> None:
    status, events = await _stream(client, "/v1/completions", {"prompt": "x", "stream": True})
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["seq"] for c in chunks] == [0, 1, 2]
    assert {c["total"] for c in chunks} == {3}
    assert chunks[0]["object"] == "text_completion"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert (
        streams.classify(streams.StreamResult(status=status, events=tuple(events), expected_chunks=3))
        is streams.Outcome.OK
    )


async def test_chat_stream_has_deltas(client: TestClient) -> None:
    status, events = await _stream(
        client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    chunks = [json.loads(e) for e in events[:-1]]
    assert status == 200
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == " t0 t1 t2"
    assert [c["seq"] for c in chunks] == [0, 1, 2, 3]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


async def test_stream_content_type(client: TestClient) -> None:
    async with client.post("/v1/completions", json={"stream": True}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        await resp.read()


@pytest.mark.parametrize(
    ("body", "query", "expected"),
    [
        pytest.param({"chunks": 5}, {}, 5, id="body-chunks"),
        pytest.param({"max_tokens": 4}, {}, 4, id="body-max-tokens"),
        pytest.param({"chunks": 5}, {"chunks": "2"}, 2, id="query-wins"),
        pytest.param({"chunks": 0}, {}, 0, id="zero"),
    ],
)
async def test_chunk_overrides(client: TestClient, body: dict[str, Any], query: dict[str, str], expected: int) -> None:
    _, events = await _stream(client, "/v1/completions", {"stream": True, **body}, params=query)
    assert len(events) == expected + 1


async def test_interval_override_paces_chunks(client: TestClient) -> None:
    started = time.monotonic()
    await _stream(client, "/v1/completions", {"stream": True, "chunks": 4, "interval_ms": 50})
    assert time.monotonic() - started >= 0.15  # three gaps of 50 ms


@pytest.mark.parametrize("body", [{"chunks": -1}, {"chunks": "many"}, {"interval_ms": 10**9}, {"chunks": True}])
async def test_bad_overrides_are_400(client: TestClient, body: dict[str, Any]) -> None:
    async with client.post("/v1/completions", json={"stream": True, **body}) as resp:
        assert resp.status == 400
        assert "error" in await resp.json()


async def test_not_json_is_400(client: TestClient) -> None:
    async with client.post("/v1/completions", data=b"{nope") as resp:
        assert resp.status == 400


async def test_non_streaming(client: TestClient) -> None:
    async with client.post("/v1/completions", json={"prompt": "x", "chunks": 2}) as resp:
        body = await resp.json()
    assert body["choices"][0]["text"] == " t0 t1"
    assert body["usage"]["completion_tokens"] == 2
    async with client.post("/v1/chat/completions", json={"messages": [], "chunks": 1}) as resp:
        body = await resp.json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " t0"}


def _http(stats: dict[str, int]) -> dict[str, int]:
    """The completions' counters of a /stats answer (the realtime sessions' are tested on their own)."""
    return {key: stats[key] for key in ("started", "finished", "cancelled", "active")}


async def test_health_models_and_stats(client: TestClient) -> None:
    async with client.get("/health") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "ok"})
    async with client.get("/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "fake-model"
    await _stream(client, "/v1/completions", {"stream": True})
    await _stream(client, "/v1/completions", {"stream": False})
    async with client.get("/stats") as resp:
        assert _http(await resp.json()) == {"started": 2, "finished": 2, "cancelled": 0, "active": 0}


async def _stats(client: TestClient) -> dict[str, int]:
    async with client.get("/stats") as resp:
        return dict(await resp.json())


@pytest.mark.parametrize("first_token_ms", [0, 10_000], ids=["mid-stream", "during-prefill"])
async def test_client_disconnect_counts_cancelled(client: TestClient, first_token_ms: int) -> None:
    """1. a stream starts 2. the client leaves (mid-stream, or during a silent prefill).
    Result: the server notices at once and counts it cancelled, not finished."""
    request = asyncio.create_task(
        client.post(
            "/v1/completions",
            json={"stream": True, "chunks": 1000, "interval_ms": 10, "first_token_ms": first_token_ms},
        )
    )
    await wait_until(lambda: _stats(client), 5, "one active stream", until=lambda s: s["active"] == 1)
    if first_token_ms:
        request.cancel()  # no headers yet: the client gives up waiting, its connection closes
        with pytest.raises(asyncio.CancelledError):
            await request
    else:
        resp = await request
        await resp.content.readuntil(b"\n\n")
        resp.close()  # drops the connection mid-stream
    stats = await wait_until(lambda: _stats(client), 5, "no active stream", until=lambda s: s["active"] == 0)
    assert _http(stats) == {"started": 1, "finished": 0, "cancelled": 1, "active": 0}


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "drain_router_dev", "fake-model", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _listening_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    event = json.loads(line)
    assert event["event"] == "fake_model.listening", line
    return int(event["port"])


@pytest.fixture
def spawned() -> Any:
    procs: list[subprocess.Popen[str]] = []

    def spawn(*args: str) -> subprocess.Popen[str]:
        procs.append(proc := _spawn(*args))
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        if proc.stdout:
            proc.stdout.close()


async def _open_stream(session: aiohttp.ClientSession, port: int) -> aiohttp.ClientResponse:
    resp = await session.post(
        f"http://127.0.0.1:{port}/v1/completions", json={"stream": True, "chunks": 20, "interval_ms": 50}
    )
    await resp.content.readuntil(b"\n\n")  # the first chunk: the stream is running
    return resp


async def _read_rest(resp: aiohttp.ClientResponse) -> streams.Outcome:
    events = ['{"seq": 0, "total": 20}']
    decoder = streams.SSEDecoder()
    try:
        async for data in resp.content.iter_any():
            events.extend(decoder.feed(data))
    except aiohttp.ClientError as exc:
        return streams.classify(streams.StreamResult(status=200, events=tuple(events), error=str(exc)))
    finally:
        resp.close()
    return streams.classify(streams.StreamResult(status=200, events=tuple(events), expected_chunks=20))


@pytest.mark.slow
async def test_sigterm_lets_streams_finish(spawned: Any) -> None:
    """1. a stream runs 2. SIGTERM. Result: the stream still ends with [DONE]; the process exits 0."""
    proc = spawned()
    port = await asyncio.to_thread(_listening_port, proc)
    async with aiohttp.ClientSession() as session:
        resp = await _open_stream(session, port)
        proc.send_signal(signal.SIGTERM)
        assert await _read_rest(resp) is streams.Outcome.OK
    assert await asyncio.to_thread(proc.wait, 10) == 0


@pytest.mark.slow
async def test_exit_on_sigterm_cuts_streams(spawned: Any) -> None:
    """1. a stream runs on --exit-on-sigterm 2. SIGTERM. Result: the process dies at once, the stream is cut."""
    proc = spawned("--exit-on-sigterm")
    port = await asyncio.to_thread(_listening_port, proc)
    async with aiohttp.ClientSession() as session:
        resp = await _open_stream(session, port)
        proc.send_signal(signal.SIGTERM)
        assert await _read_rest(resp) is streams.Outcome.CUT
    assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGTERM


@pytest.mark.slow
async def test_unix_socket(spawned: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "model.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "drain_router_dev", "fake-model", "--uds", path],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(await asyncio.to_thread(proc.stdout.readline))["uds"] == path
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
            async with session.get("http://localhost/health") as resp:
                assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
        proc.stdout.close() if proc.stdout else None


# -- vLLM's --shutdown-timeout semantics, on the application in this loop (serve.shut_down). -------


@pytest.fixture
async def served() -> Any:
    """``await served()``: the fake model on a loopback port in this loop; ``(runner, state, port)``."""
    runners: list[web.AppRunner] = []

    async def serve() -> tuple[web.AppRunner, fake_state.State, int]:
        state = fake_state.State()
        app = fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=1), state)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1)
        runners.append(runner)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, state, runner.addresses[0][1]

    yield serve
    for runner in runners:
        await runner.cleanup()


async def _raw_stream(port: int, chunks: int, interval_ms: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream request over a raw keep-alive connection, once its first chunk arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"stream": True, "chunks": chunks, "interval_ms": interval_ms}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await asyncio.wait_for(reader.readuntil(b"data: "), 5)
    return reader, writer


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_shutdown_stops_accepting_and_lets_in_flight_finish(served: Any) -> None:
    """1. a stream runs; an idle keep-alive connection is open 2. shut_down(timeout 10).
    Result: new connections are refused and the idle one is closed at once; the stream ends with
    [DONE]; nothing aborted; the shutdown returns when the stream ended, not at the timeout."""
    runner, state, port = await served()
    reader, writer = await _raw_stream(port, chunks=40, interval_ms=20)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    idle_writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(idle_reader.readuntil(b'{"status": "ok"}'), 5)

    started = time.monotonic()
    shutdown = asyncio.create_task(serve.shut_down(runner, state, 10))
    assert await asyncio.wait_for(idle_reader.read(), 2) == b"", "the idle keep-alive connection stays open"
    assert await _refused(port), "a new connection was accepted after the shutdown began"
    assert state.active == 1, ("checked too late: the stream had already ended", state.stats())
    rest = await asyncio.wait_for(reader.read(), 5)
    assert b"data: [DONE]" in rest, rest[-80:]
    assert await asyncio.wait_for(shutdown, 5) == 0
    assert time.monotonic() - started < 2, "the shutdown waited past the end of the last stream"
    assert _http(state.stats()) == {"started": 1, "finished": 1, "cancelled": 0, "active": 0}
    writer.close()
    idle_writer.close()


@pytest.mark.parametrize("timeout", [0.0, 0.3], ids=["zero-aborts-at-once", "deadline"])
async def test_shutdown_aborts_what_runs_past_the_timeout(served: Any, timeout: float) -> None:
    """1. two streams that need 10 s run 2. shut_down(timeout). Result: at the timeout (at once for
    0, vLLM's default, where aiohttp's own shutdown_timeout would wait forever) both are aborted and
    counted; the shutdown ends right after."""
    runner, state, port = await served()
    opened = [await _raw_stream(port, chunks=500, interval_ms=20) for _ in range(2)]
    started = time.monotonic()
    assert await asyncio.wait_for(serve.shut_down(runner, state, timeout), 5) == 2
    took = time.monotonic() - started
    assert timeout <= took < timeout + 0.5, took
    for reader, writer in opened:
        assert b"data: [DONE]" not in await asyncio.wait_for(reader.read(), 2)
        writer.close()
    assert _http(state.stats()) == {"started": 2, "finished": 0, "cancelled": 2, "active": 0}


def test_help_states_the_vllm_semantics() -> None:
    result = CliRunner().invoke(serve.command, ["--help"])
    text = " ".join(result.output.split())
    assert "--shutdown-timeout" in text and "vllm serve --shutdown-timeout N" in text
    assert "stop accepting" in text and "aborted" in text
