"""What the model server's side does to relayed calls: its GOAWAY (streams in flight finish, new
ones go on a new connection), its failures, and responses the router will not relay."""

from __future__ import annotations

import grpc
import pytest
from hyperframe import frame as hf

from drain_router_dev.process import wait_until
from tests import grpcupstream, rawh2upstream
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight
from tests.h2client import RawClient


async def test_the_model_servers_goaway_lets_streams_finish_and_new_ones_use_a_new_connection(
    grpc_router: StartGrpcRouter,
) -> None:
    """grpcio's max connection age sends GOAWAY after 300 ms and keeps listening: the stream in
    flight on the old connection ends OK, and calls started after the GOAWAY succeed."""
    age = (("grpc.max_connection_age_ms", 300), ("grpc.max_connection_age_grace_ms", 20_000))
    async with grpcupstream.running(options=age) as aging:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{aging.port}")
        async with grpcupstream.channel(router.grpc_port) as ch:
            stream = grpcupstream.method(ch, "Stream")(b"15 100", timeout=20)
            assert await stream.read() == b"tok0"
            await router.wait_event("grpc.upstream_goaway")
            assert await grpcupstream.method(ch, "Echo")(b"after", timeout=5) == b"after"
            rest = [m async for m in _rest(stream)]
            assert await stream.code() == grpc.StatusCode.OK
        assert len(rest) == 14
    assert await grpc_requests(router) == {("0", "completed"): 2.0}


async def _rest(call):  # type: ignore[no-untyped-def]
    while (message := await call.read()) != grpc.aio.EOF:
        yield message


def _dies_mid_stream(stream_id, encoder):  # type: ignore[no-untyped-def]
    block = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    first = hf.DataFrame(stream_id, data=b"\x00\x00\x00\x00\x04tok0")
    return [hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]), first, rawh2upstream.CLOSE]


async def test_a_model_server_that_dies_mid_stream_ends_the_call_unavailable(grpc_router: StartGrpcRouter) -> None:
    """The model server's connection is cut after the first message: the client gets that message,
    then UNAVAILABLE (trailers from the router), never a hang; counted upstream_error."""
    async with rawh2upstream.serving(_dies_mid_stream) as port:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{port}")
        async with grpcupstream.channel(router.grpc_port) as ch:
            stream = grpcupstream.method(ch, "Stream")(b"2 0", timeout=5)
            assert await stream.read() == b"tok0"
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for _ in _rest(stream):
                    pass
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "connection was lost" in (failed.value.details() or "")
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    assert await grpc_requests(router) == {("14", "upstream_error"): 1.0}


def _bad_head(stream_id, encoder):  # type: ignore[no-untyped-def]
    block = encoder.encode([(":status", "200"), ("Content-Type", "application/grpc")])
    return [hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS"])]


def _over_window(stream_id, encoder):  # type: ignore[no-untyped-def]
    block = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    whole = b"\x00" + (15_995).to_bytes(4, "big") + b"m" * 15_995  # one message per frame
    data = [hf.DataFrame(stream_id, data=whole) for _ in range(40)]  # 640 KB, past the 256 KiB window
    return [hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]), *data]


async def test_an_invalid_response_head_is_unavailable_to_the_client(grpc_router: StartGrpcRouter) -> None:
    """An uppercase field name (RFC 9113 §8.2.1): the client gets UNAVAILABLE, never the head;
    counted upstream_error."""
    async with rawh2upstream.serving(_bad_head) as port:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{port}")
        async with grpcupstream.channel(router.grpc_port) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await grpcupstream.method(ch, "Echo")(b"x", timeout=5)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "invalid response" in (failed.value.details() or "")
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    assert await grpc_requests(router) == {("14", "upstream_error"): 1.0}


async def test_data_past_the_window_the_router_opened_ends_the_call_unavailable(grpc_router: StartGrpcRouter) -> None:
    """The model server sends 640 KB at once on a stream whose window is 256 KiB, while the client
    (64 KiB window, not yet re-opened) lets no window come back: the stream to the model server is
    reset FLOW_CONTROL_ERROR, and the client gets what was relayed, then grpc-status 14."""
    async with rawh2upstream.serving(_over_window) as port:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{port}")
        client = await RawClient.connect(router.grpc_port)
        client.call(1, "/t.T/Stream", b"1 0")
        await client.wait_for(lambda c: len(c.received_data(1)) >= 64_000, what="the client's window of data")
        client.send(hf.WindowUpdateFrame(0, window_increment=2**30), hf.WindowUpdateFrame(1, window_increment=2**30))
        ended = await client.wait_for(
            lambda c: [f for f in c.of(hf.HeadersFrame, 1) if "END_STREAM" in f.flags], what="the trailers"
        )
        client.decode_all()
        trailers = dict(client.response_headers(1)[-1])
        assert trailers[b"grpc-status"] == b"14" and b"invalid response" in trailers[b"grpc-message"], ended
        client.close()
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    assert await grpc_requests(router) == {("14", "upstream_error"): 1.0}


async def test_a_model_server_that_accepts_but_never_answers_does_not_hold_up_a_sigterm_at_startup() -> None:
    """Before binding, the gRPC listener connects to the model server to learn its stream limit, for
    up to the connect timeout (30 s here). A model server that accepts and then says nothing (a
    stopped process): a SIGTERM then ends the wait at once, the gRPC listener is never bound, and
    the router exits 0 well inside the timeout."""
    import asyncio
    import signal

    from tests.process import RouterProcess

    accepted = asyncio.Event()
    silent: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)
        accepted.set()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    router = await RouterProcess.start(
        "--upstream", "http://127.0.0.1:9", "--shutdown-drain-secs", "0", "--upstream-connect-timeout-secs", "30",
        "--grpc-port", "0", "--grpc-upstream", f"http://127.0.0.1:{port}",
    )  # fmt: skip
    try:
        await asyncio.wait_for(accepted.wait(), 20)
        router.signal(signal.SIGTERM)
        assert await router.wait(10) == 0
        listening = [e for e in router.events if e.get("event") == "startup.listening"]
        assert all(e.get("grpc_port") is None for e in listening), listening
    finally:
        await router.kill()
        for writer in silent:
            writer.close()
        server.close()
