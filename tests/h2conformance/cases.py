"""h2spec's cases as data: for each, the frames it sends and the verdicts it waits for, in order.

A case is a list of steps: frames to send (:class:`Headers`, :class:`Continuation`, :class:`Data`,
:class:`PushPromise`, :class:`Raw` and its builders) and verdicts (:class:`Expect`, the methods of
:class:`~tests.h2conformance.peer.Peer`), run in order on one connection by :func:`run`. The ids,
titles, frames and verdicts follow h2spec's ``generic/``, ``http2/`` and ``hpack/`` sources; where
they adapt to a gRPC relay, :class:`Target` says how.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.h2client import PREFACE, message
from tests.h2conformance.peer import (
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Peer,
    Verdict,
    frame,
)

Fields = tuple[tuple[str, str], ...]

#: h2spec's ``--max-header-length`` default: the value of each ``x-dummyN`` field (spec.DummyHeaders).
MAX_HEADER_LEN = 4000
#: The response a flow-control case reads, from the gRPC upstream's Stream method: 4 messages of 4 KiB.
STREAM_REQUEST = b"4 0 4096"


@dataclass(frozen=True)
class Target:
    """Where a case runs, and how h2spec's requests are asked of it.

    h2spec asks ``GET /`` (``:method``, ``:scheme``, ``:path``, ``:authority``; spec.CommonHeaders).
    The reference server (``grpc=False``) is asked exactly that. A gRPC relay answers gRPC calls:
    there the request is ``POST /t.T/Echo`` (the test upstream's unary echo) with ``content-type:
    application/grpc`` and ``te: trailers`` appended after every other field, and a body h2spec sends
    (``test``) goes as one gRPC message. Where a case waits for a response (``Headers(respond=True)``)
    and h2spec ends the request on its HEADERS, the gRPC request ends instead with a DATA frame
    carrying one message right after the header block (a unary call needs its message to be answered).
    Elsewhere h2spec's frames go as they are. Where h2spec needs a response body to flow-control
    (``Req(large=True)``), the gRPC request is the upstream's server-streaming ``/t.T/Stream``
    (:data:`STREAM_REQUEST`) and the reference server's is a large file.
    """

    name: str
    port: int
    grpc: bool
    large_path: str = "/large.bin"
    exact_codes: bool = True
    """A GOAWAY must carry the code the RFC names (the router's targets); False for the reference
    server, held as h2spec holds a server."""

    def fields(self, req: Req) -> list[tuple[str, str]]:
        default_path = "/t.T/Stream" if self.grpc and req.large else "/t.T/Echo" if self.grpc else "/"
        if req.large and not self.grpc:
            default_path = self.large_path
        pseudo = [
            (":method", req.method or ("POST" if self.grpc else "GET")),
            (":scheme", "http"),
            (":path", default_path if req.path is None else req.path),
            (":authority", f"127.0.0.1:{self.port}"),
        ]
        out = [*req.before, *(pseudo[i] for i in req.keep)]
        if req.repeat is not None:
            out.append(pseudo[req.repeat])
        out += [*req.after, *dummies(req.dummies)]
        if self.grpc:
            out += [("content-type", "application/grpc"), ("te", "trailers")]
        return out

    def body(self, payload: bytes) -> bytes:
        return message(payload) if self.grpc else payload

    def sized_body(self, size: int) -> bytes:
        """A body of exactly ``size`` octets (spec.DummyString): for gRPC, one message."""
        return message(b"x" * (size - 5)) if self.grpc else b"x" * size

    def request_body(self, req: Req) -> bytes:
        """The message that ends a gRPC request waiting for its response."""
        return message(STREAM_REQUEST if req.large else b"h2spec")


def dummies(n: int) -> Fields:
    """spec.DummyHeaders(c, n): ``x-dummy0`` ... with values of :data:`MAX_HEADER_LEN` octets."""
    return tuple((f"x-dummy{i}", "x" * MAX_HEADER_LEN) for i in range(n))


@dataclass(frozen=True)
class Req:
    """spec.CommonHeaders as the target asks for it, changed as a case changes it."""

    method: str | None = None
    """``headers[0].Value = ...`` (the gRPC targets always POST unless a case sets another)."""
    path: str | None = None
    keep: tuple[int, ...] = (0, 1, 2, 3)
    """Which of the four pseudo-header fields are sent, in this order."""
    repeat: int | None = None
    """One pseudo-header field (by index) sent a second time after the four."""
    before: Fields = ()
    after: Fields = ()
    dummies: int = 0
    large: bool = False


DUMMY = dummies(1)


@dataclass
class Run:
    """One case on one connection."""

    peer: Peer
    target: Target
    pending: dict[int, bytes] = field(default_factory=dict)
    """gRPC request messages waiting for the end of their header block (``respond``)."""
    last_block: bytes = b""

    def encode(self, fields: Req | Fields) -> bytes:
        headers = self.target.fields(fields) if isinstance(fields, Req) else list(fields)
        self.last_block = self.peer.encoder.encode(headers)
        return self.last_block

    def block_ended(self, sid: int) -> None:
        body = self.pending.pop(sid, None)
        if body is not None:
            self.peer.send_raw(frame(DATA, END_STREAM, sid, body))


@dataclass(frozen=True)
class Headers:
    """A HEADERS frame with a block encoded by the connection's encoder (spec.Conn.EncodeHeaders)."""

    sid: int
    fields: Req | Fields = Req()
    end_stream: bool = False
    end_headers: bool = True
    respond: bool = False
    """The case waits for the response: the gRPC request ends with a message (see :class:`Target`)."""
    pad: int = 0
    priority: tuple[int, bool, int] | None = None
    """(dependency, exclusive, weight) in the frame."""
    prefix: bytes | Callable[[Peer], bytes] = b""
    """Raw HPACK bytes before the encoded block."""
    suffix: bytes = b""
    """Raw HPACK bytes after it."""
    table_size: int | None = None
    """The encoder's dynamic table is resized first (its size update starts the block)."""
    split: tuple[int, ...] = ()
    """Cut the block at these offsets: HEADERS then CONTINUATION frames (the last with END_HEADERS)."""
    again: bool = False
    """Send the previous block again instead of encoding one."""
    bad_padding: bool = False
    """PADDED with a pad length past the frame's end (http2/6.2/4)."""

    async def run(self, run: Run) -> None:
        peer, target = run.peer, run.target
        if self.table_size is not None:
            peer.encoder.header_table_size = self.table_size
        block = run.last_block if self.again else run.encode(self.fields)
        prefix = self.prefix(peer) if callable(self.prefix) else self.prefix
        block = prefix + block + self.suffix
        end_stream = self.end_stream
        if self.respond and target.grpc and end_stream:
            assert isinstance(self.fields, Req)
            run.pending[self.sid] = target.request_body(self.fields)
            end_stream = False
        flags = END_STREAM if end_stream else 0
        if self.bad_padding:
            peer.send_raw(frame(HEADERS, flags | END_HEADERS | PADDED, self.sid, bytes([len(block) + 2]) + block))
            return
        cuts = [0, *self.split, len(block)]
        parts = [block[a:b] for a, b in itertools.pairwise(cuts)]
        first = parts[0]
        if self.priority is not None:
            dep, exclusive, weight = self.priority
            first = (dep | (0x80000000 if exclusive else 0)).to_bytes(4, "big") + bytes([weight]) + first
            flags |= PRIORITY_FLAG
        if self.pad:
            first = bytes([self.pad]) + first + b"\0" * self.pad
            flags |= PADDED
        last = len(parts) == 1
        peer.send_raw(frame(HEADERS, flags | (END_HEADERS if self.end_headers and last else 0), self.sid, first))
        for i, part in enumerate(parts[1:], 2):
            end = END_HEADERS if i == len(parts) else 0
            peer.send_raw(frame(CONTINUATION, end, self.sid, part))
        if self.end_headers:
            run.block_ended(self.sid)


@dataclass(frozen=True)
class Continuation:
    sid: int
    fields: Req | Fields = DUMMY
    end_headers: bool = True
    again: bool = False
    """The previous block again (http2/5.1/7)."""

    async def run(self, run: Run) -> None:
        block = run.last_block if self.again else run.encode(self.fields)
        run.peer.send_raw(frame(CONTINUATION, END_HEADERS if self.end_headers else 0, self.sid, block))
        if self.end_headers:
            run.block_ended(self.sid)


@dataclass(frozen=True)
class Data:
    sid: int
    payload: bytes = b"test"
    end_stream: bool = True
    pad: int = 0
    past_max_frame: int | None = None
    """A body of the server's SETTINGS_MAX_FRAME_SIZE plus this many octets instead of ``payload``."""

    async def run(self, run: Run) -> None:
        peer, target = run.peer, run.target
        if self.past_max_frame is not None:
            size = peer.server_settings.get(MAX_FRAME_SIZE, DEFAULT_MAX_FRAME) + self.past_max_frame
            body = target.sized_body(size)
        else:
            body = target.body(self.payload)
        flags = END_STREAM if self.end_stream else 0
        if self.pad:
            body = bytes([self.pad]) + body + b"\0" * self.pad
            flags |= PADDED
        peer.send_raw(frame(DATA, flags, self.sid, body))


@dataclass(frozen=True)
class PushPromise:
    sid: int
    promised: int
    fields: Req = Req()

    async def run(self, run: Run) -> None:
        payload = self.promised.to_bytes(4, "big") + run.encode(self.fields)
        run.peer.send_raw(frame(PUSH_PROMISE, END_HEADERS, self.sid, payload))


@dataclass(frozen=True)
class Raw:
    """Bytes sent as they are (h2spec's conn.Send and WriteRawFrame)."""

    data: bytes

    async def run(self, run: Run) -> None:
        run.peer.send_raw(self.data)


def priority(sid: int, dep: int = 0, weight: int = 255, exclusive: bool = False) -> Raw:
    return Raw(frame(PRIORITY, 0, sid, (dep | (0x80000000 if exclusive else 0)).to_bytes(4, "big") + bytes([weight])))


def rst(sid: int, code: int = CANCEL) -> Raw:
    return Raw(frame(RST_STREAM, 0, sid, code.to_bytes(4, "big")))


def settings(*pairs: tuple[int, int]) -> Raw:
    return Raw(frame(SETTINGS, 0, 0, b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in pairs)))


def ping(data: bytes = bytes(8), ack: bool = False) -> Raw:
    return Raw(frame(PING, 1 if ack else 0, 0, data))


def goaway(last: int, code: int, debug: bytes = b"") -> Raw:
    return Raw(frame(GOAWAY, 0, 0, last.to_bytes(4, "big") + code.to_bytes(4, "big") + debug))


def window_update(sid: int, increment: int) -> Raw:
    return Raw(frame(WINDOW_UPDATE, 0, sid, increment.to_bytes(4, "big")))


def unknown_frame() -> Raw:
    """A frame of type 0x16 with 8 octets of zeros (http2/4.1/1, 5.5)."""
    return Raw(b"\x00\x00\x08\x16\x00\x00\x00\x00\x00" + bytes(8))


@dataclass(frozen=True)
class Expect:
    """A verdict: a method of :class:`Peer` (spec/verifier.go), awaited with ``args``."""

    verdict: str
    args: tuple[Any, ...] = ()

    async def run(self, run: Run) -> None:
        await getattr(run.peer, self.verdict)(*self.args)


def expect(verdict: str, *args: Any) -> Expect:
    return Expect(verdict, args)


@dataclass(frozen=True)
class ResponseLength:
    """spec.ServerDataLength: a separate connection asks for the response the case will read; with
    fewer than ``at_least`` octets of DATA the case is skipped (the case needs that much to flow)."""

    at_least: int

    async def run(self, run: Run) -> None:
        other = await Peer.open(run.target.port)
        try:
            probe = Run(other, run.target)
            await Headers(1, Req(large=True), end_stream=True, respond=True).run(probe)
            length = await other.response_length(1)
        finally:
            other.close()
        if length < self.at_least:
            pytest.skip(f"the response has {length} octets of DATA; the case needs {self.at_least}")


@dataclass(frozen=True)
class ConcurrencyBurst:
    """http2/5.1.2/1: SETTINGS_INITIAL_WINDOW_SIZE 0 (so no response ends), then one stream more than
    the server's SETTINGS_MAX_CONCURRENT_STREAMS, all with one header block. Skipped, as by h2spec,
    when the server announced no limit."""

    async def run(self, run: Run) -> None:
        peer, target = run.peer, run.target
        limit = peer.server_settings.get(MAX_CONCURRENT_STREAMS)
        if limit is None:
            pytest.skip("the server announced no SETTINGS_MAX_CONCURRENT_STREAMS")
        peer.send_raw(settings((INITIAL_WINDOW_SIZE, 0)).data)
        req = Req()
        block = run.encode(req)
        flags = END_HEADERS if target.grpc else END_HEADERS | END_STREAM
        burst = bytearray()
        for i in range(limit + 1):
            sid = 2 * i + 1
            burst += frame(HEADERS, flags, sid, block)
            if target.grpc:
                burst += frame(DATA, END_STREAM, sid, target.request_body(req))
        peer.send_raw(bytes(burst))


Step = Headers | Continuation | Data | PushPromise | Raw | Expect | ResponseLength | ConcurrencyBurst


@dataclass(frozen=True)
class Case:
    id: str
    """h2spec's: ``group/section/number``."""
    title: str
    steps: tuple[Step, ...]
    handshake: bool = True
    """False: the case sends the preface itself."""
    reference_xfail: str | None = None
    """Why the reference server (nghttpd) is known to fail this case."""


async def run(case: Case, target: Target) -> None:
    """Run ``case`` against ``target`` on a new connection; a failed verdict fails the test with what
    h2spec expects and what came."""
    peer = await Peer.open(target.port, preface=case.handshake)
    peer.exact_codes = target.exact_codes
    failed: Verdict | None = None
    try:
        state = Run(peer, target)
        for step in case.steps:
            await step.run(state)
    except Verdict as verdict:
        failed = verdict
    finally:
        peer.close()
    if failed is not None:
        pytest.fail(f"{case.id} ({case.title}): {failed}", pytrace=False)


# -- the cases ------------------------------------------------------------------------------------

REQ = Req()
POST = Req(method="POST")
ZERO = bytes(8)
H2SPEC = b"h2spec\0\0"
CLIENT_PREFACE = (Raw(PREFACE), settings((INITIAL_WINDOW_SIZE, 65_535)), expect("server_preface"))


def get(req: Req = REQ, **kw: Any) -> Headers:
    """h2spec's GET request on stream 1, to be answered: HEADERS with END_STREAM (see :class:`Target`
    for gRPC)."""
    return Headers(1, req, end_stream=True, respond=True, **kw)


def hpack_case(id: str, title: str, *, suffix: bytes = b"", prefix: bytes = b"", table_size: int | None = None) -> Case:
    """A request whose header block gets raw HPACK bytes; it must be answered."""
    headers = Headers(1, REQ, end_stream=True, respond=True, suffix=suffix, prefix=prefix, table_size=table_size)
    return Case(id, title, (headers, expect("headers_frame", 1)))


def compression_case(id: str, title: str, *, suffix: bytes = b"", prefix: Any = b"") -> Case:
    """A request whose header block gets invalid HPACK bytes: COMPRESSION_ERROR."""
    headers = Headers(1, REQ, end_stream=True, suffix=suffix, prefix=prefix)
    return Case(id, title, (headers, expect("connection_error", COMPRESSION_ERROR)))


def malformed(id: str, title: str, req: Req) -> Case:
    """A request with a malformed header list (RFC 9113 §8): a stream error PROTOCOL_ERROR."""
    return Case(id, title, (Headers(1, req, end_stream=True), expect("stream_error", PROTOCOL_ERROR)))


def size_update_past_limit(peer: Peer) -> bytes:
    """A dynamic table size update to the server's SETTINGS_HEADER_TABLE_SIZE + 1 (hpack/6.3/1)."""
    size = peer.server_settings.get(HEADER_TABLE_SIZE, 4096) + 1
    out = bytearray([31])
    size -= 31
    while size >= 128:
        out.append(0x80 | (size & 0x7F))
        size >>= 7
    out.append(size)
    out[0] |= 0x20
    return bytes(out)


GENERIC: tuple[Case, ...] = (
    Case("generic/1/1", "Sends a client connection preface", CLIENT_PREFACE, handshake=False),
    Case("generic/2/1", "Sends a PRIORITY frame on idle stream", (priority(1), ping(), expect("ping_ack", ZERO))),
    Case(
        "generic/2/2",
        "Sends a WINDOW_UPDATE frame on half-closed (remote) stream",
        (settings((INITIAL_WINDOW_SIZE, 0)), get(), window_update(1, 1), expect("event_type", DATA)),
    ),
    Case(
        "generic/2/3",
        "Sends a PRIORITY frame on half-closed (remote) stream",
        (settings((INITIAL_WINDOW_SIZE, 0)), get(), priority(1), window_update(1, 1), expect("event_type", DATA)),
    ),
    Case(
        "generic/2/4",
        "Sends a RST_STREAM frame on half-closed (remote) stream",
        (Headers(1, end_stream=True), rst(1), ping(), expect("ping_ack_or_close", ZERO)),
    ),
    Case(
        "generic/2/5",
        "Sends a PRIORITY frame on closed stream",
        (get(), expect("stream_close"), priority(1), ping(), expect("ping_ack", ZERO)),
    ),
    Case("generic/3.1/1", "Sends a DATA frame", (Headers(1, POST), Data(1), expect("headers_frame", 1))),
    Case(
        "generic/3.1/2",
        "Sends multiple DATA frames",
        (Headers(1, POST), Data(1, end_stream=False), Data(1), expect("headers_frame", 1)),
    ),
    Case(
        "generic/3.1/3",
        "Sends a DATA frame with padding",
        (Headers(1, POST), Data(1, pad=5), expect("headers_frame", 1)),
    ),
    Case("generic/3.2/1", "Sends a HEADERS frame", (get(), expect("headers_frame", 1))),
    Case("generic/3.2/2", "Sends a HEADERS frame with padding", (get(pad=8), expect("headers_frame", 1))),
    Case(
        "generic/3.2/3",
        "Sends a HEADERS frame with priority",
        (get(priority=(0, False, 255)), expect("headers_frame", 1)),
    ),
    Case(
        "generic/3.3/1",
        "Sends a PRIORITY frame with priority 1",
        (priority(1, weight=0), get(), expect("headers_frame", 1)),
    ),
    Case("generic/3.3/2", "Sends a PRIORITY frame with priority 256", (priority(1), get(), expect("headers_frame", 1))),
    Case(
        "generic/3.3/3",
        "Sends a PRIORITY frame with stream dependency",
        (priority(3, dep=1, weight=0), get(), expect("headers_frame", 1)),
    ),
    Case(
        "generic/3.3/4",
        "Sends a PRIORITY frame with exclusive",
        (priority(1, weight=0, exclusive=True), get(), expect("headers_frame", 1)),
    ),
    Case(
        "generic/3.3/5",
        "Sends a PRIORITY frame for an idle stream, then send a HEADER frame for a lower stream ID",
        (priority(3), get(), expect("headers_frame", 1)),
    ),
    Case("generic/3.4/1", "Sends a RST_STREAM frame", (Headers(1), rst(1), ping(), expect("ping_ack_or_close", ZERO))),
    Case(
        "generic/3.5/1",
        "Sends a SETTINGS frame",
        (
            settings(
                (HEADER_TABLE_SIZE, 4096),
                (ENABLE_PUSH, 1),
                (MAX_CONCURRENT_STREAMS, 100),
                (INITIAL_WINDOW_SIZE, 65_535),
                (MAX_FRAME_SIZE, 16_384),
                (MAX_HEADER_LIST_SIZE, 100),
            ),
            expect("settings_ack"),
        ),
    ),
    Case("generic/3.7/1", "Sends a PING frame", (ping(H2SPEC), expect("ping_ack", H2SPEC))),
    Case(
        "generic/3.8/1",
        "Sends a GOAWAY frame",
        (goaway(0, NO_ERROR, b"h2spec"), ping(H2SPEC), expect("ping_ack_or_close", H2SPEC)),
    ),
    Case(
        "generic/3.9/1",
        "Sends a WINDOW_UPDATE frame with stream ID 0",
        (window_update(0, 1), ping(), expect("ping_ack", ZERO)),
    ),
    Case(
        "generic/3.9/2",
        "Sends a WINDOW_UPDATE frame with stream ID 1",
        (get(), window_update(1, 1), expect("headers_frame", 1)),
    ),
    Case("generic/3.10/1", "Sends a CONTINUATION frame", (get(split=(5,)), expect("headers_frame", 1))),
    Case("generic/3.10/2", "Sends multiple CONTINUATION frames", (get(split=(5, 10)), expect("headers_frame", 1))),
    Case("generic/4/1", "Sends a GET request", (get(), expect("headers_frame", 1))),
    Case(
        "generic/4/2",
        "Sends a HEAD request",
        # Sent as h2spec sends it: a gRPC server answers a HEAD with an error head, no message needed.
        (Headers(1, Req(method="HEAD"), end_stream=True), expect("headers_frame", 1)),
    ),
    Case("generic/4/3", "Sends a POST request", (Headers(1, POST), Data(1), expect("headers_frame", 1))),
    Case(
        "generic/4/4",
        "Sends a POST request with trailers",
        (
            Headers(1, Req(method="POST", after=(("trailer", "x-test"),))),
            Data(1, end_stream=False),
            Headers(1, (("x-test", "ok"),), end_stream=True),
            expect("headers_frame", 1),
        ),
    ),
    hpack_case("generic/5/1", "Sends a indexed header field representation", suffix=b"\xba"),
    hpack_case(
        "generic/5/2",
        "Sends a literal header field with incremental indexing - indexed name",
        suffix=b"\x40\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/3",
        "Sends a literal header field with incremental indexing - indexed name (with Huffman coding)",
        suffix=b"\x40\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    ),
    hpack_case(
        "generic/5/4",
        "Sends a literal header field with incremental indexing - new name",
        suffix=b"\x40\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    ),
    hpack_case(
        "generic/5/5",
        "Sends a literal header field with incremental indexing - new name (with Huffman coding)",
        suffix=b"\x40\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/6",
        "Sends a literal header field without indexing - indexed name",
        suffix=b"\x00\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    ),
    hpack_case(
        "generic/5/7",
        "Sends a literal header field without indexing - indexed name (with Huffman coding)",
        suffix=b"\x00\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/8",
        "Sends a literal header field without indexing - new name",
        suffix=b"\x00\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    ),
    hpack_case(
        "generic/5/9",
        "Sends a literal header field without indexing - new name (huffman encoded)",
        suffix=b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/10",
        "Sends a literal header field never indexed - indexed name",
        suffix=b"\x10\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    ),
    hpack_case(
        "generic/5/11",
        "Sends a literal header field never indexed - indexed name (huffman encoded)",
        suffix=b"\x10\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/12",
        "Sends a literal header field never indexed - new name",
        suffix=b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    ),
    hpack_case(
        "generic/5/13",
        "Sends a literal header field never indexed - new name (huffman encoded)",
        suffix=b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    ),
    hpack_case("generic/5/14", "Sends a dynamic table size update", table_size=128),
    hpack_case("generic/5/15", "Sends multiple dynamic table size update", prefix=b"\x3f\x61\x3f\xe1\x1f"),
)

HTTP2: tuple[Case, ...] = (
    Case("http2/3.5/1", "Sends client connection preface", CLIENT_PREFACE, handshake=False),
    Case(
        "http2/3.5/2",
        "Sends invalid connection preface",
        (Raw(b"INVALID CONNECTION PREFACE\r\n\r\n"), expect("connection_error", PROTOCOL_ERROR)),
        handshake=False,
    ),
    Case("http2/4.1/1", "Sends a frame with unknown type", (unknown_frame(), ping(), expect("ping_ack", ZERO))),
    Case(
        "http2/4.1/2",
        "Sends a frame with undefined flag",
        (Raw(b"\x00\x00\x08\x06\x16\x00\x00\x00\x00" + ZERO), expect("event_type", PING)),
    ),
    Case(
        "http2/4.1/3",
        "Sends a frame with reserved field bit",
        (Raw(b"\x00\x00\x08\x06\x16\x80\x00\x00\x00" + ZERO), expect("event_type", PING)),
    ),
    Case(
        "http2/4.2/1",
        "Sends a DATA frame with 2^14 octets in length",
        (Headers(1, POST), Data(1, past_max_frame=0), expect("headers_frame", 1)),
    ),
    Case(
        "http2/4.2/2",
        "Sends a large size DATA frame that exceeds the SETTINGS_MAX_FRAME_SIZE",
        (Headers(1, POST), Data(1, past_max_frame=1), expect("stream_error", FRAME_SIZE_ERROR)),
    ),
    Case(
        "http2/4.2/3",
        "Sends a large size HEADERS frame that exceeds the SETTINGS_MAX_FRAME_SIZE",
        (Headers(1, Req(dummies=5), end_stream=True), expect("connection_error", FRAME_SIZE_ERROR)),
    ),
    Case(
        "http2/4.3/1",
        "Sends invalid header block fragment",
        (Raw(b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x40"), expect("connection_error", COMPRESSION_ERROR)),
    ),
    Case(
        "http2/4.3/2",
        "Sends a PRIORITY frame while sending the header blocks",
        (Headers(1, end_headers=False), priority(1), Continuation(1), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/4.3/3",
        "Sends a HEADERS frame to another stream while sending the header blocks",
        (
            Headers(1, end_headers=False),
            Headers(3, end_stream=True),
            Continuation(1),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/5.1/1",
        "idle: Sends a DATA frame",
        (Data(1), expect("stream_error", PROTOCOL_ERROR, STREAM_CLOSED)),
    ),
    Case("http2/5.1/2", "idle: Sends a RST_STREAM frame", (rst(1), expect("connection_error", PROTOCOL_ERROR))),
    Case(
        "http2/5.1/3",
        "idle: Sends a WINDOW_UPDATE frame",
        (window_update(1, 100), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.1/4",
        "idle: Sends a CONTINUATION frame",
        (Continuation(1, REQ), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.1/5",
        "half closed (remote): Sends a DATA frame",
        (Headers(1, end_stream=True), Data(1), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/5.1/6",
        "half closed (remote): Sends a HEADERS frame",
        (Headers(1, end_stream=True), Headers(1, end_stream=True), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/5.1/7",
        "half closed (remote): Sends a CONTINUATION frame",
        (
            Headers(1, end_stream=True),
            Continuation(1, again=True),
            expect("stream_error", STREAM_CLOSED, PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/5.1/8",
        "closed: Sends a DATA frame after sending RST_STREAM frame",
        (Headers(1), rst(1), Data(1), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/5.1/9",
        "closed: Sends a HEADERS frame after sending RST_STREAM frame",
        (Headers(1), rst(1), Headers(1, end_stream=True), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/5.1/10",
        "closed: Sends a CONTINUATION frame after sending RST_STREAM frame",
        (Headers(1), rst(1), Continuation(1), expect("stream_error", STREAM_CLOSED, PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.1/11",
        "closed: Sends a DATA frame",
        (get(), expect("stream_close"), Data(1), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/5.1/12",
        "closed: Sends a HEADERS frame",
        (
            get(),
            expect("stream_close"),
            Headers(1, end_stream=True, again=True),
            expect("connection_error", STREAM_CLOSED),
        ),
    ),
    Case(
        "http2/5.1/13",
        "closed: Sends a CONTINUATION frame",
        (get(), expect("stream_close"), Continuation(1), expect("connection_error", STREAM_CLOSED, PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.1.1/1",
        "Sends even-numbered stream identifier",
        (Headers(2, end_stream=True), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.1.1/2",
        "Sends stream identifier that is numerically smaller than previous",
        (Headers(5, end_stream=True), Headers(3, end_stream=True), expect("connection_error", PROTOCOL_ERROR)),
        reference_xfail="nghttp2 ignores a request HEADERS whose stream id is below the last one instead of a"
        " connection error: it cannot tell such a stream from one it already closed (a documented choice of nghttp2)",
    ),
    Case(
        "http2/5.1.2/1",
        "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded",
        (ConcurrencyBurst(), expect("stream_error", PROTOCOL_ERROR, REFUSED_STREAM)),
    ),
    Case(
        "http2/5.3.1/1",
        "Sends HEADERS frame that depends on itself",
        (Headers(1, end_stream=True, priority=(1, False, 255)), expect("stream_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.3.1/2",
        "Sends PRIORITY frame that depend on itself",
        (priority(1, dep=1), expect("stream_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/5.4.1/1",
        "Sends an invalid PING frame for connection close",
        (Raw(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03" + ZERO), expect("connection_close")),
    ),
    Case(
        "http2/5.4.1/2",
        "Sends an invalid PING frame to receive GOAWAY frame (h2spec --strict only)",
        (Raw(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03" + ZERO), expect("first", GOAWAY, "a GOAWAY frame")),
    ),
    Case("http2/5.5/1", "Sends an unknown extension frame", (unknown_frame(), ping(), expect("ping_ack", ZERO))),
    Case(
        "http2/5.5/2",
        "Sends an unknown extension frame in the middle of a header block",
        (Headers(1, end_stream=True, end_headers=False), unknown_frame(), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.1/1",
        "Sends a DATA frame with 0x0 stream identifier",
        (Data(0), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.1/2",
        'Sends a DATA frame on the stream that is not in "open" or "half-closed (local)" state',
        (Headers(1, POST, end_stream=True), Data(1), expect("stream_error", STREAM_CLOSED)),
    ),
    Case(
        "http2/6.1/3",
        "Sends a DATA frame with invalid pad length",
        (
            Headers(1, Req(method="POST", after=(("content-length", "4"),))),
            Raw(b"\x00\x00\x05\x00\x09\x00\x00\x00\x01" + b"\x06\x54\x65\x73\x74"),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/6.2/1",
        "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame",
        (Headers(1, end_headers=False), priority(1), Continuation(1), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.2/2",
        "Sends a HEADERS frame to another stream while sending a HEADERS frame",
        (
            Headers(1, end_headers=False),
            Headers(3, end_stream=True),
            Continuation(1),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/6.2/3",
        "Sends a HEADERS frame with 0x0 stream identifier",
        (Headers(0, end_stream=True), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.2/4",
        "Sends a HEADERS frame with invalid pad length",
        (Headers(1, end_stream=True, bad_padding=True), expect("stream_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.3/1",
        "Sends a PRIORITY frame with 0x0 stream identifier",
        (priority(0), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.3/2",
        "Sends a PRIORITY frame with a length other than 5 octets",
        (
            Headers(1, end_stream=True),
            Raw(b"\x00\x00\x04\x02\x00\x00\x00\x00\x01" + b"\x80\x00\x00\x01"),
            expect("stream_error", FRAME_SIZE_ERROR),
        ),
    ),
    Case(
        "http2/6.4/1",
        "Sends a RST_STREAM frame with 0x0 stream identifier",
        (rst(0), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.4/2",
        "Sends a RST_STREAM frame on a idle stream",
        (rst(1), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.4/3",
        "Sends a RST_STREAM frame with a length other than 4 octets",
        (
            Headers(1, end_stream=True),
            Raw(b"\x00\x00\x03\x03\x00\x00\x00\x00\x01" + b"\x00\x00\x00"),
            expect("stream_error", FRAME_SIZE_ERROR),
        ),
    ),
    Case(
        "http2/6.5/1",
        "Sends a SETTINGS frame with ACK flag and payload",
        (Raw(b"\x00\x00\x01\x04\x01\x00\x00\x00\x00" + b"\x00"), expect("connection_error", FRAME_SIZE_ERROR)),
    ),
    Case(
        "http2/6.5/2",
        "Sends a SETTINGS frame with a stream identifier other than 0x0",
        (
            Raw(b"\x00\x00\x06\x04\x00\x00\x00\x00\x01" + b"\x00\x03\x00\x00\x00\x64"),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/6.5/3",
        "Sends a SETTINGS frame with a length other than a multiple of 6 octets",
        (
            Raw(b"\x00\x00\x03\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00"),
            expect("stream_error", PROTOCOL_ERROR, FRAME_SIZE_ERROR),
        ),
    ),
    Case(
        "http2/6.5.2/1",
        "SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1",
        (settings((ENABLE_PUSH, 2)), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.5.2/2",
        "SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow control window size",
        (settings((INITIAL_WINDOW_SIZE, 2**31)), expect("connection_error", FLOW_CONTROL_ERROR)),
    ),
    Case(
        "http2/6.5.2/3",
        "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value",
        (settings((MAX_FRAME_SIZE, 16_383)), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.5.2/4",
        "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size",
        (settings((MAX_FRAME_SIZE, 2**24)), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.5.2/5",
        "Sends a SETTINGS frame with unknown identifier",
        (settings((0xFF, 1)), ping(), expect("ping_ack", ZERO)),
    ),
    Case(
        "http2/6.5.3/1",
        "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE",
        (
            ResponseLength(1),
            settings((INITIAL_WINDOW_SIZE, 100), (INITIAL_WINDOW_SIZE, 1)),
            expect("settings_ack"),
            get(Req(large=True)),
            expect("data_length", 1),
        ),
    ),
    Case(
        "http2/6.5.3/2",
        "Sends a SETTINGS frame without ACK flag",
        (settings((ENABLE_PUSH, 0)), expect("settings_ack")),
    ),
    Case("http2/6.7/1", "Sends a PING frame", (ping(H2SPEC), expect("ping_ack", H2SPEC))),
    Case(
        "http2/6.7/2",
        "Sends a PING frame with ACK",
        (ping(b"invalid\0", ack=True), ping(H2SPEC), expect("ping_ack", H2SPEC)),
    ),
    Case(
        "http2/6.7/3",
        "Sends a PING frame with a stream identifier field value other than 0x0",
        (Raw(b"\x00\x00\x08\x06\x00\x00\x00\x00\x01" + ZERO), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.7/4",
        "Sends a PING frame with a length field value other than 8",
        (Raw(b"\x00\x00\x06\x06\x00\x00\x00\x00\x00" + bytes(6)), expect("connection_error", FRAME_SIZE_ERROR)),
    ),
    Case(
        "http2/6.8/1",
        "Sends a GOAWAY frame with a stream identifier other than 0x0",
        (Raw(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01" + ZERO), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.9/1",
        "Sends a WINDOW_UPDATE frame with a flow control window increment of 0",
        (window_update(0, 0), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.9/2",
        "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream",
        (Headers(1), window_update(1, 0), expect("stream_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.9/3",
        "Sends a WINDOW_UPDATE frame with a length other than 4 octets",
        (Raw(b"\x00\x00\x03\x08\x00\x00\x00\x00\x00" + b"\x00\x00\x01"), expect("connection_error", FRAME_SIZE_ERROR)),
    ),
    Case(
        "http2/6.9.1/1",
        "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame",
        (
            ResponseLength(1),
            settings((INITIAL_WINDOW_SIZE, 1)),
            expect("settings_ack"),
            get(Req(large=True)),
            expect("data_length", 1),
        ),
    ),
    Case(
        "http2/6.9.1/2",
        "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1",
        (window_update(0, 2**31 - 1), window_update(0, 2**31 - 1), expect("goaway_code", FLOW_CONTROL_ERROR)),
    ),
    Case(
        "http2/6.9.1/3",
        "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream",
        (
            Headers(1),
            window_update(1, 2**31 - 1),
            window_update(1, 2**31 - 1),
            expect("rst_stream_code", 1, FLOW_CONTROL_ERROR),
        ),
    ),
    Case(
        "http2/6.9.2/1",
        "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame",
        (
            ResponseLength(1),
            settings((INITIAL_WINDOW_SIZE, 0)),
            expect("settings_ack"),
            get(Req(large=True)),
            settings((INITIAL_WINDOW_SIZE, 1)),
            expect("data_length", 1),
        ),
    ),
    Case(
        "http2/6.9.2/2",
        "Sends a SETTINGS frame for window size to be negative",
        (
            ResponseLength(5),
            settings((INITIAL_WINDOW_SIZE, 3)),
            expect("settings_ack"),
            get(Req(large=True)),
            expect("event_type", DATA),
            settings((INITIAL_WINDOW_SIZE, 2)),
            expect("settings_ack"),
            window_update(1, 2),
            expect("data_length", 1),
        ),
    ),
    Case(
        "http2/6.9.2/3",
        "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size value",
        (
            Raw(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x04\x80\x00\x00\x00"),
            expect("connection_error", FLOW_CONTROL_ERROR),
        ),
    ),
    Case(
        "http2/6.10/1",
        "Sends multiple CONTINUATION frames preceded by a HEADERS frame",
        (
            get(end_headers=False),
            Continuation(1, end_headers=False),
            Continuation(1),
            expect("headers_frame", 1),
        ),
    ),
    Case(
        "http2/6.10/2",
        "Sends a CONTINUATION frame followed by any frame other than CONTINUATION",
        (
            Headers(1, POST, end_headers=False),
            Continuation(1, end_headers=False),
            Data(1),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/6.10/3",
        "Sends a CONTINUATION frame with 0x0 stream identifier",
        (Headers(1, end_stream=True, end_headers=False), Continuation(0), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.10/4",
        "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag",
        (Headers(1, end_stream=True), Continuation(1), expect("connection_error", PROTOCOL_ERROR)),
    ),
    Case(
        "http2/6.10/5",
        "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag",
        (
            Headers(1, end_stream=True, end_headers=False),
            Continuation(1),
            Continuation(1),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/6.10/6",
        "Sends a CONTINUATION frame preceded by a DATA frame",
        (
            Headers(1, POST, end_headers=False),
            Data(1),
            Continuation(1, end_headers=False),
            Continuation(0),
            expect("connection_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/7/1",
        "Sends a GOAWAY frame with unknown error code",
        (goaway(0, 0xFF), ping(H2SPEC), expect("ping_ack_or_close", H2SPEC)),
    ),
    Case(
        "http2/7/2",
        "Sends a RST_STREAM frame with unknown error code",
        (Headers(1, POST), rst(1, 0xFF), ping(), expect("ping_ack_or_close", ZERO)),
    ),
    Case(
        "http2/8.1/1",
        "Sends a second HEADERS frame without the END_STREAM flag",
        (
            Headers(1, POST),
            Data(1, end_stream=False),
            Headers(1, (("x-test", "ok"),)),
            expect("stream_error", PROTOCOL_ERROR),
        ),
    ),
    malformed(
        "http2/8.1.2/1",
        "Sends a HEADERS frame that contains the header field name in uppercase letters",
        Req(after=(("X-TEST", "ok"),)),
    ),
    malformed(
        "http2/8.1.2.1/1",
        "Sends a HEADERS frame that contains a unknown pseudo-header field",
        Req(after=((":test", "ok"),)),
    ),
    malformed(
        "http2/8.1.2.1/2",
        "Sends a HEADERS frame that contains the pseudo-header field defined for response",
        Req(after=((":status", "200"),)),
    ),
    Case(
        "http2/8.1.2.1/3",
        "Sends a HEADERS frame that contains a pseudo-header field as trailers",
        (
            Headers(1, POST),
            Data(1, end_stream=False),
            Headers(1, ((":method", "POST"),)),
            expect("stream_error", PROTOCOL_ERROR),
        ),
    ),
    malformed(
        "http2/8.1.2.1/4",
        "Sends a HEADERS frame that contains a pseudo-header field that appears in a header block after a"
        " regular header field",
        Req(before=(("x-test", "ok"),)),
    ),
    malformed(
        "http2/8.1.2.2/1",
        "Sends a HEADERS frame that contains the connection-specific header field",
        Req(after=(("connection", "keep-alive"),)),
    ),
    malformed(
        "http2/8.1.2.2/2",
        'Sends a HEADERS frame that contains the TE header field with any value other than "trailers"',
        Req(after=(("trailers", "test"), ("te", "trailers, deflate"))),
    ),
    malformed("http2/8.1.2.3/1", 'Sends a HEADERS frame with empty ":path" pseudo-header field', Req(path="")),
    # h2spec encodes ``headers[1:]`` of [:scheme, :path, :authority] here: :scheme goes missing too.
    malformed("http2/8.1.2.3/2", 'Sends a HEADERS frame that omits ":method" pseudo-header field', Req(keep=(2, 3))),
    malformed("http2/8.1.2.3/3", 'Sends a HEADERS frame that omits ":scheme" pseudo-header field', Req(keep=(0, 2, 3))),
    malformed("http2/8.1.2.3/4", 'Sends a HEADERS frame that omits ":path" pseudo-header field', Req(keep=(0, 1, 3))),
    malformed("http2/8.1.2.3/5", 'Sends a HEADERS frame with duplicated ":method" pseudo-header field', Req(repeat=0)),
    malformed("http2/8.1.2.3/6", 'Sends a HEADERS frame with duplicated ":scheme" pseudo-header field', Req(repeat=1)),
    malformed("http2/8.1.2.3/7", 'Sends a HEADERS frame with duplicated ":path" pseudo-header field', Req(repeat=2)),
    Case(
        "http2/8.1.2.6/1",
        'Sends a HEADERS frame with the "content-length" header field which does not equal the DATA frame payload'
        " length",
        (
            Headers(1, Req(method="POST", after=(("content-length", "1"),))),
            Data(1),
            expect("stream_error", PROTOCOL_ERROR),
        ),
    ),
    Case(
        "http2/8.1.2.6/2",
        'Sends a HEADERS frame with the "content-length" header field which does not equal the sum of the multiple'
        " DATA frames payload length",
        (
            Headers(1, Req(method="POST", after=(("content-length", "1"),))),
            Data(1, end_stream=False),
            Data(1),
            expect("stream_error", PROTOCOL_ERROR),
        ),
    ),
    Case("http2/8.2/1", "Sends a PUSH_PROMISE frame", (PushPromise(1, 3), expect("connection_error", PROTOCOL_ERROR))),
)

HPACK: tuple[Case, ...] = (
    compression_case("hpack/2.3.3/1", "Sends a indexed header field representation with invalid index", suffix=b"\xc6"),
    compression_case(
        "hpack/2.3.3/2", "Sends a literal header field representation with invalid index", suffix=b"\x7f\x07\x00"
    ),
    compression_case("hpack/4.2/1", "Sends a dynamic table size update at the end of header block", suffix=b"\x21"),
    compression_case(
        "hpack/5.2/1",
        "Sends a Huffman-encoded string literal representation with padding longer than 7 bits",
        suffix=b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff",
    ),
    compression_case(
        "hpack/5.2/2",
        "Sends a Huffman-encoded string literal representation padded by zero",
        suffix=b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90",
    ),
    compression_case(
        "hpack/5.2/3",
        "Sends a Huffman-encoded string literal representation containing the EOS symbol",
        suffix=b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f",
    ),
    compression_case("hpack/6.1/1", "Sends a indexed header field representation with index 0", suffix=b"\x80"),
    compression_case(
        "hpack/6.3/1",
        "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE",
        prefix=size_update_past_limit,
    ),
)

CASES: tuple[Case, ...] = GENERIC + HTTP2 + HPACK
