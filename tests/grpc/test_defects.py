"""Regression tests of the gRPC listener's HTTP/2 defects, from raw sockets against a real router
process. Each test is named after its defect and states the rule it pins (RFC 9113, docs/grpc.md); each
failed against the router before the HTTP/2 layer's explicit stream state machine."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack
import psutil
import pytest
from hyperframe import frame as hf

from drain_router.h2 import rules
from drain_router_dev.process import wait_until
from tests import grpcupstream
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight
from tests.h2client import PREFACE, RawClient, message, request_headers
from tests.process import RouterProcess

NO_ERROR = 0
PROTOCOL_ERROR = 1
FLOW_CONTROL_ERROR = 3
STREAM_CLOSED = 5
REFUSED_STREAM = 7
CANCEL = 8
ENHANCE_YOUR_CALM = 11
HEADER_TABLE_SIZE = 0x1
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535

#: A server-streaming call that stays open for the whole test: a message now, then one a second.
LONG = message(b"100000 1000")


# -- shared pieces ----------------------------------------------------------------------------------


@pytest.fixture
async def opened() -> AsyncIterator[list[Any]]:
    """What a test opens (raw clients, sockets, writers): closed at its end, whether it passed or not."""
    things: list[Any] = []
    yield things
    for thing in things:
        thing.close()


def rss(router: RouterProcess) -> int:
    return int(psutil.Process(router.proc.pid).memory_info().rss)


async def connected(router: RouterProcess, opened: list[Any], settings: dict[int, int] | None = None) -> RawClient:
    """A raw client past the preface: the router's SETTINGS has arrived."""
    assert router.grpc_port is not None
    client = await RawClient.connect(router.grpc_port, settings=settings)
    opened.append(client)
    await client.wait_for(
        lambda c: [f for f in c.of(hf.SettingsFrame) if "ACK" not in f.flags], what="the router's SETTINGS"
    )
    return client


def reset_or_goaway(stream_id: int) -> Any:
    return lambda c: c.of(hf.RstStreamFrame, stream_id) or c.of(hf.GoAwayFrame)


async def reset_code(client: RawClient, stream_id: int, timeout: float = 2.0) -> int:
    """The code of the RST_STREAM the router sends on ``stream_id`` (a GOAWAY instead fails)."""
    found = await client.wait_for(reset_or_goaway(stream_id), timeout, f"RST_STREAM on stream {stream_id}")
    assert isinstance(found[0], hf.RstStreamFrame), f"GOAWAY instead of RST_STREAM: {client.summary()}"
    return int(found[0].error_code)


async def answered(client: RawClient, opaque: bytes, timeout: float = 10.0) -> str:
    """A PING, then wait for its acknowledgement ("ack": every frame sent before it was processed)
    or a GOAWAY ("goaway")."""
    client.send(hf.PingFrame(0, opaque_data=opaque))

    def seen(c: RawClient) -> str | None:
        if c.of(hf.GoAwayFrame):
            return "goaway"
        if any("ACK" in f.flags and f.opaque_data == opaque for f in c.of(hf.PingFrame)):
            return "ack"
        return None

    return str(await client.wait_for(seen, timeout, f"the PING {opaque!r} answered or a GOAWAY"))


def ended(client: RawClient, stream_id: int) -> bool:
    return any("END_STREAM" in f.flags for f in client.of(hf.HeadersFrame, stream_id))


def grpc_status(client: RawClient, stream_id: int) -> bytes | None:
    client.decode_all()
    blocks = client.response_headers(stream_id)
    return dict(blocks[-1]).get(b"grpc-status") if blocks else None


async def inflight_back_to_zero(router: RouterProcess, timeout: float = 3.0) -> None:
    await wait_until(lambda: inflight(router), timeout=timeout, what="in-flight back to 0", until=lambda n: n == 0)


async def open_stream(client: RawClient, stream_id: int, *, end: bool) -> None:
    """A long server-streaming call on ``stream_id`` (half-closed by the client when ``end``), waited
    for until its first message arrives: the model server's handler runs."""
    client.headers(stream_id, request_headers("/t.T/Stream"))
    client.data(stream_id, LONG, end_stream=end)
    await client.wait_for(lambda c: c.received_data(stream_id), what=f"the first message on stream {stream_id}")


class Bystander:
    """Another client's call on the same upstream connection, open while a client misbehaves:
    whatever that client sends, this call completes with grpc-status 0."""

    def __init__(self, router: RouterProcess) -> None:
        assert router.grpc_port is not None
        self.channel = grpcupstream.channel(router.grpc_port)
        self.call: Any = None

    async def __aenter__(self) -> Bystander:
        self.call = grpcupstream.method(self.channel, "Stream")(b"6 100", timeout=10)
        assert await self.call.read() == b"tok0"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def completes(self) -> None:
        try:
            while await self.call.read() != grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            raise AssertionError(f"another client's call ended {exc.code()}: {exc.details()!r}") from None
        assert await self.call.code() == grpc.StatusCode.OK


async def silent_socket(port: int | None, opened: list[Any]) -> socket.socket:
    """A client socket that is never read, with a small receive buffer."""
    assert port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    opened.append(sock)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def send_all(sock: socket.socket, data: bytes) -> None:
    await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(sock, data), 10)


def open_windows() -> bytes:
    """The preface with every window opened to the maximum, and the router's SETTINGS acknowledged
    blindly (it is always the first frame the router sends)."""
    return b"".join(
        (
            PREFACE,
            hf.SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: MAX_WINDOW}).serialize(),
            hf.SettingsFrame(0, flags=["ACK"]).serialize(),
            hf.WindowUpdateFrame(0, window_increment=MAX_WINDOW - DEFAULT_WINDOW).serialize(),
        )
    )


def request_frames(encoder: hpack.Encoder, stream_id: int, path: str, body: bytes, **extra: str) -> bytes:
    head = hf.HeadersFrame(stream_id, data=encoder.encode(request_headers(path, **extra)), flags=["END_HEADERS"])
    return head.serialize() + hf.DataFrame(stream_id, data=message(body), flags=["END_STREAM"]).serialize()


# -- 1. a stream that leaves the connection without ending its call -------------------------------


async def test_defect1_headers_after_end_stream_ends_the_call_once(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """RFC 9113 §5.1: HEADERS on a half-closed (remote) stream is a stream error STREAM_CLOSED. The
    router's RST_STREAM ends the relayed call then, exactly once (`client_aborted`): the
    model server's stream is cancelled, in-flight is back to 0 while the client stays connected, and
    SIGTERM then exits 0 at once, long before the deadline."""
    router = await grpc_router("--termination-grace-secs", "8")
    client = await connected(router, opened)
    await open_stream(client, 1, end=True)
    client.headers(1, request_headers("/t.T/Stream"), end_stream=True)
    assert await reset_code(client, 1) == STREAM_CLOSED
    await inflight_back_to_zero(router)
    await wait_until(lambda: upstream.cancelled_at, timeout=10, what="the model server's stream cancelled")
    outcomes = await grpc_requests(router)
    assert outcomes.get(("none", "client_aborted")) == 1.0 and sum(outcomes.values()) == 1.0, outcomes
    sent = time.monotonic()
    router.signal(signal.SIGTERM)
    assert await router.wait(10) == 0
    assert time.monotonic() - sent < 3.0  # the deadline is 6 s after SIGTERM


async def test_defect1_streams_reset_after_their_end_never_exceed_the_stream_limit(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS (100) bounds the calls one connection holds at the model server,
    whatever way its streams end: 300 long calls, each followed by a second HEADERS the router resets
    (STREAM_CLOSED), never have more than 100 in flight or active upstream at once. The resets count
    against the reset budget, so the connection may get GOAWAY ENHANCE_YOUR_CALM (and nothing else);
    in-flight is back to 0 with the client still connected."""
    router = await grpc_router()
    client = await connected(router, opened)
    for i in range(300):
        sid = 2 * i + 1
        client.headers(sid, request_headers("/t.T/Stream"))
        client.data(sid, LONG, end_stream=True)
        client.headers(sid, request_headers("/t.T/Stream"), end_stream=True)
        await client.wait_for(reset_or_goaway(sid), what=f"stream {sid} reset")
        if client.of(hf.GoAwayFrame):
            break
        n = await inflight(router)
        assert n <= rules.MAX_CONCURRENT_STREAMS, f"{n} calls in flight on one connection after {i + 1} streams"
    assert [g.error_code for g in client.of(hf.GoAwayFrame)] in ([], [ENHANCE_YOUR_CALM]), client.summary()
    assert {f.error_code for f in client.of(hf.RstStreamFrame)} <= {STREAM_CLOSED, REFUSED_STREAM}
    await inflight_back_to_zero(router)
    await wait_until(lambda: upstream.active, timeout=5, what="no stream active upstream", until=lambda n: n == 0)
    assert upstream.max_active <= rules.MAX_CONCURRENT_STREAMS, upstream.max_active


# -- 2. header blocks relayed unchecked -------------------------------------------------------------

BAD_FIELDS: dict[str, tuple[str, str]] = {
    "uppercase-name": ("X-Bad", "1"),
    "pseudo-header": (":path", "/t.T/Echo"),
    "connection": ("connection", "close"),
    "te-gzip": ("te", "gzip"),
    "transfer-encoding": ("transfer-encoding", "chunked"),
    "cr-in-value": ("x-bad", "a\rb"),
    "lf-in-value": ("x-bad", "a\nb"),
    "nul-in-value": ("x-bad", "a\x00b"),
    "leading-whitespace": ("x-bad", " a"),
}
SECOND_BLOCKS: dict[str, tuple[list[tuple[str, str]], bool]] = {
    **{f"trailers-{name}": ([("x-fine", "1"), bad], True) for name, bad in BAD_FIELDS.items()},
    "second-block-without-end-stream": ([("x-fine", "1")], False),
}


@pytest.mark.parametrize("block", SECOND_BLOCKS.values(), ids=SECOND_BLOCKS.keys())
async def test_defect2_every_request_header_block_is_checked(
    opened: list[Any],
    grpc_router: StartGrpcRouter,
    upstream: grpcupstream.Upstream,
    block: tuple[list[tuple[str, str]], bool],
) -> None:
    """RFC 9113 §8.1, §8.2: request trailers follow the same field rules as the head, and a header
    block after the head must end the stream. A malformed one is a stream error: RST_STREAM
    PROTOCOL_ERROR to that client, the model server's stream reset (cancelled), nothing of the block
    relayed, so another client's call on the same upstream connection completes with grpc-status 0."""
    fields, end = block
    router = await grpc_router()
    client = await connected(router, opened)
    async with Bystander(router) as bystander:
        await open_stream(client, 1, end=False)
        client.headers(1, fields, end_stream=end)
        await bystander.completes()
        assert await reset_code(client, 1) == PROTOCOL_ERROR
    await wait_until(lambda: upstream.cancelled_at, timeout=10, what="the model server's stream cancelled")
    await inflight_back_to_zero(router)


BAD_HEADS: dict[str, tuple[str, str]] = {
    **{f"authority-{what}": (":authority", f"rou{c}ter") for what, c in (("space", " "), ("cr", "\r"))},
    **{f"authority-{what}": (":authority", f"rou{c}ter") for what, c in (("lf", "\n"), ("nul", "\x00"))},
    **{f"scheme-{what}": (":scheme", f"ht{c}tp") for what, c in (("space", " "), ("cr", "\r"))},
    **{f"scheme-{what}": (":scheme", f"ht{c}tp") for what, c in (("lf", "\n"), ("nul", "\x00"))},
    "host-differs-from-authority": ("host", "elsewhere"),
}


@pytest.mark.parametrize("bad", BAD_HEADS.values(), ids=BAD_HEADS.keys())
async def test_defect2_authority_scheme_and_host_are_checked(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream, bad: tuple[str, str]
) -> None:
    """RFC 9113 §8.3.1, RFC 9110 §4.3.3: CR, LF, NUL or a space in ``:authority`` or ``:scheme``, or a
    ``host`` that differs from ``:authority``, makes the request malformed: RST_STREAM PROTOCOL_ERROR,
    counted ``rejected``, never forwarded; another client's call completes with grpc-status 0."""
    name, value = bad
    headers = [(n, value if n == name else v) for n, v in request_headers("/t.T/Echo")]
    if name == "host":
        headers.append((name, value))
    router = await grpc_router()
    client = await connected(router, opened)
    async with Bystander(router) as bystander:
        client.headers(1, headers)
        client.data(1, message(b"bad head"), end_stream=True)
        await bystander.completes()
        assert await reset_code(client, 1) == PROTOCOL_ERROR
    assert upstream.calls == ["Stream"]  # the bystander's
    assert (await grpc_requests(router)).get(("none", "rejected")) == 1.0


CONTENT_LENGTHS: dict[str, tuple[int, bytes, bool]] = {
    "more-data-than-declared": (len(LONG), b"xx", False),
    "end-stream-before-the-declared-length": (len(LONG) + 10, b"", True),
}


@pytest.mark.parametrize("case", CONTENT_LENGTHS.values(), ids=CONTENT_LENGTHS.keys())
async def test_defect2_content_length_must_match_the_data(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream, case: tuple[int, bytes, bool]
) -> None:
    """RFC 9113 §8.1.1: a request whose DATA exceeds its ``content-length``, or that ends short of it,
    is malformed: RST_STREAM PROTOCOL_ERROR, the model server's stream reset; another client's call
    on the same upstream connection completes with grpc-status 0."""
    declared, extra, end = case
    router = await grpc_router()
    client = await connected(router, opened)
    async with Bystander(router) as bystander:
        client.headers(1, [*request_headers("/t.T/Stream"), ("content-length", str(declared))])
        client.data(1, LONG)
        await client.wait_for(lambda c: c.received_data(1), what="the first message")
        client.data(1, extra, end_stream=end)
        await bystander.completes()
        assert await reset_code(client, 1) == PROTOCOL_ERROR
    await wait_until(lambda: upstream.cancelled_at, timeout=10, what="the model server's stream cancelled")
    await inflight_back_to_zero(router)


# -- 3. floods without a budget -------------------------------------------------------------------

FLOOD_BATCH = 50_000
FLOOD_LIMIT = 400_000
FLOOD_BOUND = 100_000
FLOODS: dict[str, hf.Frame] = {
    "priority": hf.PriorityFrame(1, depends_on=0, stream_weight=15),
    "window-update-connection": hf.WindowUpdateFrame(0, window_increment=1),
    "window-update-stream": hf.WindowUpdateFrame(1, window_increment=1),
    "empty-data": hf.DataFrame(1),
}


@pytest.mark.parametrize("flood", FLOODS.values(), ids=FLOODS.keys())
async def test_defect3_floods_of_cheap_frames_are_cut(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream, flood: hf.Frame
) -> None:
    """PRIORITY, WINDOW_UPDATE (connection and open stream) and empty DATA frames cost the router work
    and its peer nothing (the 2019 HTTP/2 floods, CVE-2019-9513/9517/9518): past a bounded number the
    connection gets GOAWAY ENHANCE_YOUR_CALM, well before 100,000 frames; in-flight is back to 0.
    Sent in batches of 50,000, each followed by a PING whose acknowledgement says the batch was read."""
    router = await grpc_router()
    client = await connected(router, opened)
    await open_stream(client, 1, end=False)
    batch = flood.serialize() * FLOOD_BATCH
    sent = 0
    while sent < FLOOD_LIMIT:
        client.send_raw(batch)
        sent += FLOOD_BATCH
        if await answered(client, b"%08d" % sent) == "goaway":
            break
    goaways = client.of(hf.GoAwayFrame)
    assert goaways, f"no GOAWAY after {sent:,} {type(flood).__name__}s: the router processed every one"
    assert goaways[0].error_code == ENHANCE_YOUR_CALM
    assert sent <= FLOOD_BOUND, f"GOAWAY only after {sent:,} frames"
    await inflight_back_to_zero(router)


MISTAKES = ("window-update-of-0", "headers-after-end-stream")


@pytest.mark.parametrize("mistake", MISTAKES)
async def test_defect3_streams_the_router_resets_count_against_the_reset_budget(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream, mistake: str
) -> None:
    """Rapid reset, the other way round: a client whose every stream makes the router reset it (a
    WINDOW_UPDATE of 0, RFC 9113 §6.9; HEADERS on a half-closed stream, §5.1) costs the model server a
    stream each like a client's own resets, so those resets spend the same budget (burst 200, 100/s):
    1,000 such streams at once get GOAWAY ENHANCE_YOUR_CALM, and in-flight is back to 0."""
    router = await grpc_router()
    client = await connected(router, opened)
    burst = bytearray()
    for i in range(1000):
        sid = 2 * i + 1
        head = client.encoder.encode(request_headers("/t.T/Echo"))
        if mistake == "window-update-of-0":
            burst += hf.HeadersFrame(sid, data=head, flags=["END_HEADERS"]).serialize()
            burst += hf.WindowUpdateFrame(sid, window_increment=0).serialize()
        else:
            burst += hf.HeadersFrame(sid, data=head, flags=["END_HEADERS"]).serialize()
            burst += hf.DataFrame(sid, data=message(b"x"), flags=["END_STREAM"]).serialize()
            again = client.encoder.encode(request_headers("/t.T/Echo"))
            burst += hf.HeadersFrame(sid, data=again, flags=["END_HEADERS", "END_STREAM"]).serialize()
    client.send_raw(bytes(burst))
    outcome = await answered(client, b"after!!!")
    resets = len(client.of(hf.RstStreamFrame))
    assert outcome == "goaway", f"the PING after 1,000 streams answered without GOAWAY ({resets} RST_STREAMs)"
    goaway = client.of(hf.GoAwayFrame)[0]
    assert goaway.error_code == ENHANCE_YOUR_CALM
    assert goaway.last_stream_id < 2 * (rules.RESETS[0] + rules.MAX_CONCURRENT_STREAMS) + 1
    await inflight_back_to_zero(router, timeout=5)


# -- 4. request trailers while the call waits for an upstream stream --------------------------------


@dataclass
class HeldUpstream:
    """A model server advertising SETTINGS_MAX_CONCURRENT_STREAMS=1 that never answers on its first
    connection, and sends its SETTINGS on a later one only once :attr:`release` is set: a call then
    waits for a stream to the model server. On a later connection each request is answered (with
    grpc-status 0) when its END_STREAM arrives."""

    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    received: list[tuple[int, Any, list[tuple[bytes, bytes]] | None]] = field(default_factory=list)
    """(connection index, frame, decoded header block or None)."""

    def blocks(self, index: int, stream_id: int) -> list[tuple[list[tuple[bytes, bytes]], bool]]:
        return [
            (headers, "END_STREAM" in frame.flags)
            for i, frame, headers in self.received
            if i == index and headers is not None and frame.stream_id == stream_id
        ]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        encoder, decoder = hpack.Encoder(), hpack.Decoder()
        try:
            await reader.readexactly(len(PREFACE))
            if index:
                await self.release.wait()
            writer.write(hf.SettingsFrame(0, settings={MAX_CONCURRENT_STREAMS: 1}).serialize())
            while True:
                frame, length = hf.Frame.parse_frame_header(memoryview(await reader.readexactly(9)))
                frame.parse_body(memoryview(await reader.readexactly(length)))
                headers = None
                if isinstance(frame, hf.HeadersFrame):
                    headers = [(bytes(n), bytes(v)) for n, v in decoder.decode(frame.data, raw=True)]
                self.received.append((index, frame, headers))
                if isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags:
                    writer.write(hf.SettingsFrame(0, flags=["ACK"]).serialize())
                elif index and isinstance(frame, (hf.HeadersFrame, hf.DataFrame)) and "END_STREAM" in frame.flags:
                    sid = frame.stream_id
                    head = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
                    tail = encoder.encode([("grpc-status", "0")])
                    writer.write(
                        hf.HeadersFrame(sid, data=head, flags=["END_HEADERS"]).serialize()
                        + hf.DataFrame(sid, data=message(b"answered")).serialize()
                        + hf.HeadersFrame(sid, data=tail, flags=["END_HEADERS", "END_STREAM"]).serialize()
                    )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def held_upstream() -> AsyncIterator[HeldUpstream]:
    up = HeldUpstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        up.release.set()
        server.close()


async def test_defect4_request_trailers_sent_while_the_call_waits_reach_the_model_server(
    opened: list[Any],
    grpc_router: StartGrpcRouter,
) -> None:
    """A call waiting for a stream to the model server (its only connection is full, the next one not
    yet settled) keeps everything the client sends, in order: HEADERS, DATA, then the request trailers
    with END_STREAM reach the model server once the stream opens, and the call completes."""
    async with held_upstream() as up:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{up.port}")
        holder = await connected(router, opened)
        holder.headers(1, request_headers("/t.T/Held"), end_stream=True)
        await wait_until(lambda: up.blocks(0, 1), timeout=3, what="the first call at the model server")
        client = await connected(router, opened)
        client.headers(1, request_headers("/t.T/Waits"))
        client.data(1, message(b"request"))
        client.headers(1, [("x-request-trailer", "end")], end_stream=True)
        assert await answered(client, b"waiting!") == "ack"  # all three read while the call waits
        await wait_until(lambda: up.connections == 2, timeout=3, what="a second connection to the model server")
        up.release.set()
        await wait_until(lambda: up.blocks(1, 1), timeout=3, what="the waiting call's stream opened")
        await wait_until(lambda: len(up.blocks(1, 1)) == 2, timeout=3, what="the request trailers at the model server")
        trailers, end = up.blocks(1, 1)[1]
        assert (trailers, end) == ([(b"x-request-trailer", b"end")], True)
        data = [f.data for i, f, _ in up.received if i == 1 and isinstance(f, hf.DataFrame) and f.stream_id == 1]
        assert b"".join(data) == message(b"request")
        await client.wait_for(lambda c: ended(c, 1), what="the call's end")
        assert grpc_status(client, 1) == b"0"


# -- 5. no timeout before the preface, none for an idle connection -----------------------------------

BEFORE_SETTINGS: dict[str, bytes] = {
    "nothing": b"",
    "part-of-the-preface": PREFACE[:10],
    "preface-without-settings": PREFACE,
}


@pytest.mark.parametrize("sent", BEFORE_SETTINGS.values(), ids=BEFORE_SETTINGS.keys())
async def test_defect5_a_connection_without_its_preface_and_settings_is_closed(
    opened: list[Any], grpc_router: StartGrpcRouter, sent: bytes
) -> None:
    """A connection that has not sent the whole preface and its SETTINGS within
    ``--client-header-timeout-secs`` (1 s here) is closed (slowloris, before any stream)."""
    router = await grpc_router("--client-header-timeout-secs", "1")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.grpc_port)
    opened.append(writer)
    writer.write(sent)
    try:
        await asyncio.wait_for(reader.read(), 4.0)  # to the end of the stream: the close
    except ConnectionError:
        pass
    except TimeoutError:
        pytest.fail("still open 4 s after connecting, with --client-header-timeout-secs 1")
    assert time.monotonic() - started >= 0.9, "closed before the timeout"


async def test_defect5_an_idle_connection_gets_goaway_after_the_keepalive_timeout(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """A connection with no open stream for ``--client-keepalive-timeout-secs`` (2 s here) gets
    GOAWAY(NO_ERROR) and is closed; one whose stream stays quiet for longer than that (a message,
    3.5 s of silence, the next) is not: its stream runs to its end with grpc-status 0."""
    router = await grpc_router("--client-header-timeout-secs", "1", "--client-keepalive-timeout-secs", "2")
    started = time.monotonic()
    idle = await connected(router, opened)
    busy = await connected(router, opened)
    busy.headers(1, request_headers("/t.T/Stream"))
    busy.data(1, message(b"2 3500"), end_stream=True)
    goaway = await idle.goaway(timeout=5)
    assert goaway.error_code == NO_ERROR
    assert time.monotonic() - started >= 1.5, "the idle connection was closed before the keepalive timeout"
    await idle.wait_closed(timeout=3)
    await busy.wait_for(lambda c: ended(c, 1), timeout=6, what="the quiet stream's end")
    assert not busy.of(hf.GoAwayFrame), busy.summary()
    assert busy.received_data(1).count(b"tok") == 2
    assert grpc_status(busy, 1) == b"0"


# -- 6. output to a client that does not read has no bound ------------------------------------------


def still_held(router: RouterProcess, client_port: int) -> bool:
    """Whether the router still has an established connection from ``client_port``."""
    conns = psutil.Process(router.proc.pid).net_connections(kind="tcp")
    return any(c.raddr and c.raddr.port == client_port and c.status == psutil.CONN_ESTABLISHED for c in conns)


async def test_defect6_output_queued_for_a_client_that_does_not_read_is_bounded(
    opened: list[Any],
    grpc_router: StartGrpcRouter,
) -> None:
    """``rules.MAX_QUEUED_OUTPUT_BYTES``: a client that never reads, sending unary calls one batch
        after another (each call ends, so the stream limit never holds it back) whose answers carry
        14 KB of metadata (not flow-controlled), has its connection cut once the router's queued output
        passes the bound, and the router's RSS grows by less than four times the bound (the RSS of a
    router grows about twice what it queues)."""
    bound = rules.MAX_QUEUED_OUTPUT_BYTES
    big = (("grpc.max_metadata_size", 64 * 1024), ("grpc.absolute_max_metadata_size", 64 * 1024))
    async with grpcupstream.running(options=big) as up:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{up.port}")
        sock = await silent_socket(router.grpc_port, opened)
        client_port = sock.getsockname()[1]
        await send_all(sock, open_windows())
        before = peak = rss(router)
        echo = "e" * 14_000
        # Literals never indexed, without Huffman: the same block for every call, cheap to decode.
        fields = request_headers("/t.T/Echo", **{"x-echo": echo})
        block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], huffman=False)
        queued, sid, cut = 0, 1, False
        while queued < 8 * bound:
            batch = b"".join(
                hf.HeadersFrame(sid + 2 * i, data=block, flags=["END_HEADERS"]).serialize()
                + hf.DataFrame(sid + 2 * i, data=message(b"x"), flags=["END_STREAM"]).serialize()
                for i in range(50)
            )
            sid += 100
            try:
                await send_all(sock, batch)
            except ConnectionError:
                cut = True
                break
            queued += 50 * len(echo)
            await wait_until(lambda: inflight(router), timeout=10, what="the batch answered", until=lambda n: n == 0)
            peak = max(peak, rss(router))
            if not still_held(router, client_port):
                cut = True
                break
        grown = peak - before
        assert cut, f"not cut after {queued / 2**20:.0f} MiB of answers queued; RSS grew {grown / 2**20:.0f} MiB"
        assert grown < 4 * bound, f"RSS grew {grown / 2**20:.1f} MiB (bound {bound / 2**20:.0f} MiB)"


# -- 7. memory held per slow-reading stream -------------------------------------------------------


async def test_defect7_a_slow_reading_stream_holds_one_stream_window(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """100 streams on one connection from a client that opened its windows and never reads, each
    receiving a server stream of 16 KiB messages without end: once flow control holds the model
    server (its ``sent_bytes`` stops moving), the router's RSS grew by at most one stream window
    (64 KiB of relayed data) and 32 KiB of bookkeeping and allocator slack per stream (measured:
    68-78 KiB; 261 KiB with the 256 KiB window before)."""
    router = await grpc_router()
    sock = await silent_socket(router.grpc_port, opened)
    encoder = hpack.Encoder()
    await send_all(sock, open_windows())
    await wait_until(lambda: inflight(router), timeout=3, what="the router up", until=lambda n: n == 0)
    before = rss(router)
    streams = rules.MAX_CONCURRENT_STREAMS
    await send_all(
        sock, b"".join(request_frames(encoder, 2 * i + 1, "/t.T/Stream", b"100000 0 16384") for i in range(streams))
    )
    await upstream.wait_active(streams)
    last = [-1, time.monotonic()]

    def held() -> bool:
        now = time.monotonic()
        if upstream.sent_bytes != last[0]:
            last[:] = [upstream.sent_bytes, now]
            return False
        return now - last[1] >= 0.5

    await wait_until(held, timeout=15, what="the model server held by flow control")
    grown = rss(router) - before
    per_stream = grown / streams
    assert per_stream <= rules.STREAM_WINDOW + 32 * 1024, (
        f"{per_stream / 1024:.0f} KiB held per slow-reading stream ({grown / 2**20:.1f} MiB for {streams} streams; "
        f"the model server sent {upstream.sent_bytes / 2**20:.1f} MiB)"
    )


# -- 8. conformance ---------------------------------------------------------------------------------


async def test_defect8_a_late_headers_on_a_stream_reset_long_ago_does_not_kill_the_connection(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """RFC 9113 §5.1: frames on a stream the router reset are ignored (or answered RST_STREAM
    STREAM_CLOSED), however many resets ago: the router knows every stream id up to the highest
    opened is closed, not only its last 256 resets. 300 malformed requests reset one by one (paced
    under the reset budget), then HEADERS again on the first: no GOAWAY, a PING is answered, nothing
    is forwarded."""
    router = await grpc_router()
    client = await connected(router, opened)
    malformed = [*request_headers("/t.T/Echo"), ("X-Upper", "1")]
    for i in range(300):
        sid = 2 * i + 1
        client.headers(sid, malformed, end_stream=True)
        assert await reset_code(client, sid) == PROTOCOL_ERROR
        if i >= 150:
            await asyncio.sleep(0.012)  # pacing under the budget's refill (100/s), not a synchronisation
    client.headers(1, request_headers("/t.T/Echo"), end_stream=True)
    outcome = await answered(client, b"late-hd!")
    assert outcome == "ack", f"the connection was killed by a late HEADERS: {client.of(hf.GoAwayFrame)[0]}"
    assert {f.error_code for f in client.of(hf.RstStreamFrame, 1)} <= {PROTOCOL_ERROR, STREAM_CLOSED}
    assert upstream.calls == []


async def test_defect8_initial_window_size_overflowing_an_open_streams_window_is_a_flow_control_error(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """RFC 9113 §6.9.2: a SETTINGS_INITIAL_WINDOW_SIZE change that makes a stream's send window exceed
    2^31-1 is a connection error FLOW_CONTROL_ERROR. An open stream's window raised near 2^31-1 by
    WINDOW_UPDATE, then INITIAL_WINDOW_SIZE raised: GOAWAY FLOW_CONTROL_ERROR; in-flight back to 0."""
    router = await grpc_router()
    client = await connected(router, opened)
    await open_stream(client, 1, end=True)
    client.send(hf.WindowUpdateFrame(1, window_increment=MAX_WINDOW - DEFAULT_WINDOW))
    client.send(hf.SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 1_000_000}))
    goaway = await client.goaway(timeout=3)
    assert goaway.error_code == FLOW_CONTROL_ERROR
    await inflight_back_to_zero(router)


async def test_defect8_data_after_end_stream_is_a_stream_closed_error(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """RFC 9113 §5.1: DATA on a half-closed (remote) stream is a stream error STREAM_CLOSED (a GOAWAY
    STREAM_CLOSED is accepted too): the call ends, its model server's stream is cancelled, in-flight
    is back to 0."""
    router = await grpc_router()
    client = await connected(router, opened)
    await open_stream(client, 1, end=True)
    client.data(1, message(b"late"))
    found = await client.wait_for(reset_or_goaway(1), timeout=3, what="RST_STREAM on stream 1")
    assert found[0].error_code == STREAM_CLOSED
    await inflight_back_to_zero(router)
    await wait_until(lambda: upstream.cancelled_at, timeout=10, what="the model server's stream cancelled")


IDLE_FRAMES: dict[str, hf.Frame] = {
    "rst-stream": hf.RstStreamFrame(5, error_code=CANCEL),
    "window-update": hf.WindowUpdateFrame(5, window_increment=1),
}


@pytest.mark.parametrize("frame", IDLE_FRAMES.values(), ids=IDLE_FRAMES.keys())
async def test_defect8_rst_stream_or_window_update_on_an_idle_stream_is_a_protocol_error(
    opened: list[Any], grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream, frame: hf.Frame
) -> None:
    """RFC 9113 §5.1: on an idle stream (an id above any opened) only HEADERS and PRIORITY may arrive;
    RST_STREAM or WINDOW_UPDATE there is a connection error PROTOCOL_ERROR."""
    router = await grpc_router()
    client = await connected(router, opened)
    client.call(1, "/t.T/Echo", b"first")
    await client.wait_for(lambda c: ended(c, 1), what="the first call's end")
    client.send(frame)
    goaway = await client.goaway(timeout=3)
    assert goaway.error_code == PROTOCOL_ERROR
