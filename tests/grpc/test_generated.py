"""Generated client traffic against the gRPC listener (hypothesis), checked by an independent HTTP/2
parser (hyperframe, hpack) rather than by the router's own code.

Each example opens one connection and sends a generated batch of streams at once: valid calls with
bodies of any size, malformed heads (RFC 9113 §8), streams reset midway, unknown methods. Invariants:
every stream the client ended gets exactly one ending from the router (END_STREAM or RST_STREAM,
never both, never two); a malformed head gets RST_STREAM PROTOCOL_ERROR and never reaches the model
server; a valid call's answer is its own body; the connection is never failed (no GOAWAY); and once
the client leaves, nothing stays in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from hyperframe import frame as hf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drain_router_dev import process as process_
from tests.h2client import RawClient, message, request_headers
from tests.process import RouterProcess, log_path

ECHO = "/inference.GRPCInferenceService/Echo"
MALFORMED = {
    "uppercase": [("X-Upper", "1")],
    "connection": [("connection", "keep-alive")],
    "te-gzip": [("te", "gzip")],
}


@dataclass(frozen=True)
class Stream:
    body: bytes
    malformed: str | None
    reset_midway: bool
    unknown_method: bool


streams = st.builds(
    Stream,
    body=st.binary(max_size=70_000),
    malformed=st.none() | st.sampled_from(sorted(MALFORMED)),
    reset_midway=st.booleans(),
    unknown_method=st.booleans(),
)


async def _start() -> tuple[process_.Process, RouterProcess]:
    argv = [sys.executable, "-m", "drain_router_dev", "fake-model", "--port", "0", "--grpc-port", "0"]
    model = process_.Process("fake-model", argv, log_path("fake-model"))
    model.start()
    lines: list[dict[str, object]] = []

    def listening() -> dict[str, object] | None:
        for line in model.new_lines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return next((e for e in lines if e.get("event") == "fake_model.listening"), None)

    engine = await process_.wait_until(listening, timeout=20, what="the fake engine listening")
    router = await RouterProcess.start(
        "--upstream", "http://127.0.0.1:9", "--shutdown-drain-secs", "0", "--grpc-port", "0",
        "--grpc-upstream", f"http://127.0.0.1:{engine['grpc_port']}",
    )  # fmt: skip
    await router.wait_event("startup.listening")
    return model, router


@pytest.fixture(scope="module")
def router() -> Iterator[RouterProcess]:
    """A fake engine (gRPC) and a router in front of it, as processes, for every example."""
    model, proc = asyncio.run(_start())
    try:
        yield proc
    finally:
        proc.proc.kill()
        model.kill()


async def _inflight(admin_port: int) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/admin/inflight") as resp:
        return int((await resp.json())["inflight"])


async def _exchange(port: int, batch: list[Stream]) -> RawClient:
    client = await RawClient.connect(port)
    for i, stream in enumerate(batch):
        sid = 2 * i + 1
        extra = MALFORMED[stream.malformed] if stream.malformed else []
        path = "/inference.GRPCInferenceService/Nope" if stream.unknown_method else ECHO
        client.headers(sid, request_headers(path) + extra)
        framed = message(stream.body)
        half = len(framed) // 2
        client.data(sid, framed[:half])
        if stream.reset_midway:
            client.send(hf.RstStreamFrame(sid, error_code=8))
        else:
            client.data(sid, framed[half:], end_stream=True)
    # Every stream the client ended is answered; the client's windows are opened as it reads.
    ended = [2 * i + 1 for i, s in enumerate(batch) if not s.reset_midway]

    def answered(c: RawClient) -> bool:
        for f in c.of(hf.DataFrame):
            if f.data:
                c.send(hf.WindowUpdateFrame(0, window_increment=len(f.data)))
                c.send(hf.WindowUpdateFrame(f.stream_id, window_increment=len(f.data)))
        return all(_endings(c, sid) for sid in ended)

    await client.wait_for(answered, timeout=20, what="an ending on every stream")
    return client


def _endings(client: RawClient, sid: int) -> list[str]:
    ends = ["end" for f in client.of(hf.HeadersFrame, sid) if "END_STREAM" in f.flags]
    ends += ["end" for f in client.of(hf.DataFrame, sid) if "END_STREAM" in f.flags]
    return ends + [f"rst:{f.error_code}" for f in client.of(hf.RstStreamFrame, sid)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(streams, min_size=1, max_size=6))
def test_generated_streams_each_get_one_ending(router: RouterProcess, batch: list[Stream]) -> None:
    port, admin = router.grpc_port, router.admin_port
    assert port is not None and admin is not None

    async def run() -> None:
        client = await _exchange(port, batch)
        try:
            assert not client.of(hf.GoAwayFrame), client.summary()
            client.decode_all()
            for i, stream in enumerate(batch):
                sid = 2 * i + 1
                ends = _endings(client, sid)
                # One ending; after a complete response the router may also reset a request the
                # client was still sending, with NO_ERROR (RFC 9113 §8.1).
                if ends[-1:] == ["rst:0"] and ends[:1] == ["end"]:
                    ends = ends[:-1]
                if stream.reset_midway:
                    assert ends in ([], ["rst:1"], ["end"]), (sid, ends)
                    continue
                assert len(ends) == 1, (sid, ends, client.summary())
                if stream.malformed:
                    assert ends == ["rst:1"], (sid, ends)
                    continue
                trailers = dict(client.response_headers(sid)[-1])
                if stream.unknown_method:
                    assert trailers[b"grpc-status"] == b"12", trailers  # UNIMPLEMENTED, from the engine
                else:
                    assert trailers[b"grpc-status"] == b"0", trailers
                    assert client.received_data(sid) == message(stream.body)
        finally:
            client.close()
        # The router learns of the close asynchronously: wait for the count to come back to 0.
        await process_.wait_until(lambda: _inflight(admin), timeout=10, what="in-flight 0", until=lambda n: n == 0)

    asyncio.run(run())
