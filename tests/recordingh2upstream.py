"""A recording HTTP/2 model server, frames by hand (hyperframe, hpack), in a thread of its own.

It decodes every header block the router sends it and records each breach of RFC 9113 §8.1-8.3 (field
names, connection-specific fields, ``te``, values, pseudo-headers, trailers) and of the stream states
of §5.1 (a header block or DATA after the router's END_STREAM or RST_STREAM), tagged with the stream's
``:path``. Each request stream's behaviour is chosen by the last segment of its ``:path``
(``/service/<behaviour>.<token>``): answered normally, reset, a malformed head, trailers-only,
malformed trailers, GOAWAY, DATA beyond the router's window, the connection closed. The test decides
when a stream's behaviour happens (:meth:`Server.act`: at once, at any later step, or never), so the
model server's frames interleave with the client's. It is independent of the code under test; the
test reads what it recorded from another thread (lists, sets and dicts are only added to, under the
GIL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import hpack
from hyperframe import frame as hf

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

BEHAVIOURS = (
    "answer",  # head, the request's body so far as it came, trailers with grpc-status 0
    "trailers_only",  # one HEADERS with grpc-status and END_STREAM
    "reset",  # RST_STREAM INTERNAL_ERROR
    "bad_head",  # a response head with an uppercase field name (§8.2.1)
    "bad_trailers",  # head, a message, trailers carrying a pseudo-header (§8.1)
    "goaway",  # GOAWAY naming this stream as the last, then answer
    "over_window",  # head, then DATA past the stream window the router advertised (§6.9.1)
    "close",  # the connection closed
)
BYSTANDER = "bystander"
"""Answered (as ``answer``) as soon as the request ended, on any connection, without being told."""

OVER_WINDOW_BYTES = 320 * 1024
"""What ``over_window`` sends without waiting for WINDOW_UPDATE: past any stream window the router may
advertise up to 256 KiB plus the default 64 KiB."""

_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"))
_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")

Headers = list[tuple[bytes, bytes]]


def field_problems(name: bytes, value: bytes) -> list[str]:
    """What §8.2 forbids in one field (pseudo-headers included: their values are field values)."""
    out = []
    bare = name[1:] if name.startswith(b":") else name
    if not bare or _BAD_NAME.search(bare) or b":" in bare:
        out.append(f"invalid field name {name!r} (§8.2.1)")
    if _BAD_VALUE.search(value):
        out.append(f"NUL, CR or LF in the value of {name!r} (§8.2.1)")
    if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        out.append(f"leading or trailing whitespace in the value of {name!r} (§8.2.1)")
    if name in _CONNECTION_SPECIFIC:
        out.append(f"connection-specific field {name!r} (§8.2.2)")
    if name == b"te" and value != b"trailers":
        out.append(f"te: {value!r} (§8.2.2)")
    return out


def head_problems(headers: Headers, *, request: bool) -> list[str]:
    """What §8.3 forbids in a request's (or a response's) header section."""
    out: list[str] = []
    allowed = _REQUEST_PSEUDO if request else frozenset((b":status",))
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        out += field_problems(name, value)
        if name.startswith(b":"):
            if regular:
                out.append(f"pseudo-header {name!r} after a regular field (§8.3)")
            if name not in allowed:
                out.append(f"unknown pseudo-header {name!r} (§8.3)")
            if name in seen:
                out.append(f"repeated pseudo-header {name!r} (§8.3)")
            seen.add(name)
        else:
            regular = True
    required = (b":method", b":scheme", b":path") if request else (b":status",)
    out += [f"no {name!r} (§8.3)" for name in required if name not in seen]
    if request and dict(headers).get(b":path") == b"":
        out.append("an empty :path (§8.3.1)")
    return out


def trailer_problems(headers: Headers, *, end_stream: bool) -> list[str]:
    """What §8.1 forbids in a trailer section (and §8.2 in its fields)."""
    out = [p for name, value in headers for p in field_problems(name, value)]
    out += [f"pseudo-header {name!r} in trailers (§8.1)" for name, _ in headers if name.startswith(b":")]
    if not end_stream:
        out.append("a second header block without END_STREAM (§8.1)")
    return out


def behaviour_of(path: bytes | None) -> tuple[str, str]:
    """``(behaviour, token)`` of a request path ``/service/<behaviour>.<token>``."""
    last = (path or b"").rsplit(b"/", 1)[-1].decode("latin-1")
    behaviour, _, token = last.partition(".")
    return (behaviour if behaviour in (*BEHAVIOURS, BYSTANDER) else "answer"), token


@dataclass
class Violation:
    token: str | None
    what: str


@dataclass
class _Stream:
    sid: int
    path: bytes | None = None
    token: str | None = None
    behaviour: str = "answer"
    blocks: int = 0
    ended: bool = False  # the router's END_STREAM
    reset_by_router: bool = False
    done: bool = False  # this end reset it, or refused it: frames crossing that are ignored
    answered: bool = False
    body: bytearray = field(default_factory=bytearray)


@dataclass
class Recorder:
    """What the router sent, as seen by the model server."""

    violations: list[Violation] = field(default_factory=list)
    reached: dict[str, int] = field(default_factory=dict)
    """Request streams that arrived, by token: how many times (a token is opened once per call)."""
    connections: int = 0
    to_act: set[str] = field(default_factory=set)
    """Tokens whose behaviour happens as soon as their stream arrives (or at once if it has)."""
    acted: set[str] = field(default_factory=set)
    settled: set[str] = field(default_factory=set)
    """Tokens told to act whose stream had arrived: acted, or could not (its stream or connection gone)."""
    live: dict[str, tuple[_Connection, _Stream]] = field(default_factory=dict)

    def violation(self, token: str | None, what: str) -> None:
        self.violations.append(Violation(token, what))


class _Connection:
    def __init__(self, recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.recorder = recorder
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.streams: dict[int, _Stream] = {}
        self.last_sid = 0
        self.goaway: int | None = None
        self.block: tuple[int, list[str], bytearray] | None = None

    def send(self, *frames: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(b"".join(f.serialize() for f in frames))

    async def run(self) -> None:
        await self.reader.readexactly(len(PREFACE))
        self.send(hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 20}))
        self.send(hf.WindowUpdateFrame(0, window_increment=1 << 24))
        while not self.writer.is_closing():
            head = await self.reader.readexactly(9)
            try:
                frame, length = hf.Frame.parse_frame_header(memoryview(head))
                frame.parse_body(memoryview(await self.reader.readexactly(length)))
            except ValueError as exc:  # hyperframe's errors, and an unknown frame's body
                self.recorder.violation(None, f"unparsable frame: {exc!r}")
                return
            self.received(frame)
            await self.writer.drain()

    def received(self, frame: Any) -> None:
        if self.block is not None and not isinstance(frame, hf.ContinuationFrame):
            self.recorder.violation(None, f"a header block interrupted by {type(frame).__name__} (§6.10)")
            self.block = None
        if isinstance(frame, hf.SettingsFrame):
            if "ACK" not in frame.flags:
                self.send(hf.SettingsFrame(0, flags=["ACK"]))
        elif isinstance(frame, hf.PingFrame):
            if "ACK" not in frame.flags:
                self.send(hf.PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]))
        elif isinstance(frame, hf.HeadersFrame):
            flags = list(frame.flags)
            if "END_HEADERS" in frame.flags:
                self.header_block(frame.stream_id, flags, bytes(frame.data))
            else:
                self.block = (frame.stream_id, flags, bytearray(frame.data))
        elif isinstance(frame, hf.ContinuationFrame):
            if self.block is None or self.block[0] != frame.stream_id:
                self.recorder.violation(None, "CONTINUATION without its HEADERS (§6.10)")
                return
            self.block[2].extend(frame.data)
            if "END_HEADERS" in frame.flags:
                sid, flags, block = self.block
                self.block = None
                self.header_block(sid, flags, bytes(block))
        elif isinstance(frame, hf.DataFrame):
            self.data(frame)
        elif isinstance(frame, hf.RstStreamFrame):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                if stream.reset_by_router and not stream.done:
                    self.recorder.violation(stream.token, "a second RST_STREAM from the router (§5.1)")
                stream.reset_by_router = True
        elif isinstance(frame, hf.PushPromiseFrame):
            self.recorder.violation(None, "PUSH_PROMISE from a client (§8.4)")

    def data(self, frame: Any) -> None:
        if frame.flow_controlled_length:
            self.send(hf.WindowUpdateFrame(0, window_increment=frame.flow_controlled_length))
        stream = self.streams.get(frame.stream_id)
        if stream is None:
            self.recorder.violation(None, f"DATA on idle stream {frame.stream_id} (§5.1)")
            return
        if stream.done:
            return
        if stream.ended or stream.reset_by_router:
            self.recorder.violation(stream.token, "DATA after the router's END_STREAM or RST_STREAM (§5.1)")
            return
        if frame.flow_controlled_length:
            self.send(hf.WindowUpdateFrame(frame.stream_id, window_increment=frame.flow_controlled_length))
        stream.body += frame.data
        if "END_STREAM" in frame.flags:
            stream.ended = True
            self.request_ended(stream)

    def header_block(self, sid: int, flags: list[str], block: bytes) -> None:
        try:
            headers: Headers = [(bytes(n), bytes(v)) for n, v in self.decoder.decode(block, raw=True)]
        except hpack.HPACKError as exc:
            self.recorder.violation(None, f"undecodable header block on stream {sid}: {exc!r}")
            return
        end = "END_STREAM" in flags
        stream = self.streams.get(sid)
        if stream is None:
            if sid % 2 == 0 or sid <= self.last_sid:
                self.recorder.violation(None, f"a new stream {sid} after {self.last_sid}, or even (§5.1.1)")
            self.last_sid = max(self.last_sid, sid)
            path = dict(headers).get(b":path")
            behaviour, token = behaviour_of(path)
            stream = self.streams[sid] = _Stream(sid, path, token, behaviour, blocks=1, ended=end)
            self.recorder.reached[token] = self.recorder.reached.get(token, 0) + 1
            for problem in head_problems(headers, request=True):
                self.recorder.violation(token, f"request head: {problem}")
            self.request_started(stream)
            return
        if stream.done:
            return
        stream.blocks += 1
        if stream.ended or stream.reset_by_router:
            self.recorder.violation(stream.token, "a header block after the router's END_STREAM or RST_STREAM (§5.1)")
            return
        for problem in trailer_problems(headers, end_stream=end):
            self.recorder.violation(stream.token, f"request trailers: {problem}")
        if end:
            stream.ended = True
            self.request_ended(stream)

    # -- the answers ------------------------------------------------------------------------------

    def request_started(self, stream: _Stream) -> None:
        if self.goaway is not None and stream.sid > self.goaway:
            stream.done = True
            self.send(hf.RstStreamFrame(stream.sid, error_code=7))  # REFUSED_STREAM: never processed
            return
        if stream.token is not None:
            self.recorder.live[stream.token] = (self, stream)
        if stream.behaviour == BYSTANDER:
            if stream.ended:
                self.answer(stream)
        elif stream.token in self.recorder.to_act:
            self.act(stream)

    def request_ended(self, stream: _Stream) -> None:
        if stream.behaviour == BYSTANDER:
            self.answer(stream)

    def act(self, stream: _Stream) -> None:
        """The stream's behaviour, once."""
        token = stream.token or ""
        self.recorder.settled.add(token)
        if token in self.recorder.acted or stream.done or self.writer.is_closing():
            return
        self.recorder.acted.add(token)
        behaviour, sid = stream.behaviour, stream.sid
        if behaviour == "goaway":
            self.goaway = sid
            self.send(hf.GoAwayFrame(0, last_stream_id=sid, error_code=0))
            self.answer(stream)
        elif behaviour == "trailers_only":
            stream.answered = True
            self.headers(sid, [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5")], True)
        elif behaviour == "reset":
            stream.done = True
            self.send(hf.RstStreamFrame(sid, error_code=2))
        elif behaviour == "bad_head":
            stream.answered = True
            self.headers(sid, [(":status", "200"), ("Content-Type", "application/grpc")], False)
        elif behaviour == "bad_trailers":
            stream.answered = True
            self.headers(sid, [(":status", "200"), ("content-type", "application/grpc")], False)
            self.send(hf.DataFrame(sid, data=_message(b"partial")))
            self.headers(sid, [("grpc-status", "0"), (":status", "200")], True)
        elif behaviour == "over_window":
            stream.answered = True
            self.headers(sid, [(":status", "200"), ("content-type", "application/grpc")], False)
            chunk = 16_384
            for _ in range(OVER_WINDOW_BYTES // chunk):
                self.send(hf.DataFrame(sid, data=b"w" * chunk))
        elif behaviour == "close":
            self.writer.close()
        else:
            self.answer(stream)

    def answer(self, stream: _Stream) -> None:
        if stream.answered:
            return
        stream.answered = True
        sid = stream.sid
        self.headers(sid, [(":status", "200"), ("content-type", "application/grpc")], False)
        if stream.body:  # the request's messages as they came (a request of a whole message each)
            self.send(hf.DataFrame(sid, data=bytes(stream.body)))
        self.headers(sid, [("grpc-status", "0"), ("x-answered-by", "recorder")], True)

    def headers(self, sid: int, headers: list[tuple[str, str]], end: bool) -> None:
        frame = hf.HeadersFrame(sid, flags=["END_HEADERS"] + (["END_STREAM"] if end else []))
        frame.data = self.encoder.encode(headers)
        self.send(frame)


def _message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


@dataclass
class Server:
    port: int
    recorder: Recorder
    loop: asyncio.AbstractEventLoop

    def act(self, token: str) -> None:
        """The behaviour of the stream ``token`` happens now, or as soon as the stream arrives."""
        self.recorder.to_act.add(token)

        def now() -> None:
            found = self.recorder.live.get(token)
            if found is not None:
                conn, stream = found
                conn.act(stream)

        self.loop.call_soon_threadsafe(now)


@contextlib.contextmanager
def running() -> Iterator[Server]:
    """The server on a free loopback port, its event loop in a daemon thread, until the exit."""
    recorder = Recorder()
    loop = asyncio.new_event_loop()
    ready: concurrent.futures.Future[int] = concurrent.futures.Future()
    stop = asyncio.Event()
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        recorder.connections += 1
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await _Connection(recorder, reader, writer).run()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            handlers.discard(task)
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.set_result(server.sockets[0].getsockname()[1])
        async with server:
            await stop.wait()
            for task in list(handlers):
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield Server(ready.result(15), recorder, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
