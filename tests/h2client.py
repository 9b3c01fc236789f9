"""A raw HTTP/2 client over a socket, frames written by hand (hyperframe, hpack): what a hostile or
simply exact client sends, and every frame the router answers, in order, with its arrival time.

It is independent of the code under test: frames are built and parsed by hyperframe and headers
compressed by its own hpack encoder.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import hpack
from hyperframe import frame as hf

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def request_headers(path: str = "/t.T/Echo", **extra: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "router"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra.items(),
    ]


def message(body: bytes) -> bytes:
    """One length-prefixed gRPC message."""
    return b"\x00" + len(body).to_bytes(4, "big") + body


@dataclass
class Seen:
    frame: Any
    at: float


@dataclass
class RawClient:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)
    frames: list[Seen] = field(default_factory=list)
    closed: bool = False
    auto_ping_ack: bool = True
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def connect(cls, port: int, *, settings: dict[int, int] | None = None, preface: bool = True) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        if preface:
            frame = hf.SettingsFrame(0)
            frame.settings = settings or {}
            writer.write(PREFACE + frame.serialize())
        client._task = asyncio.ensure_future(client._read())
        return client

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                frame, length = hf.Frame.parse_frame_header(memoryview(head))
                body = await self.reader.readexactly(length)
                frame.parse_body(memoryview(body))
                self.frames.append(Seen(frame, time.monotonic()))
                if isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags:
                    self.send(hf.SettingsFrame(0, flags=["ACK"]))
                elif isinstance(frame, hf.PingFrame) and "ACK" not in frame.flags and self.auto_ping_ack:
                    self.send(hf.PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]))
                self._changed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def send(self, *frames: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(b"".join(f.serialize() for f in frames))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def headers(self, stream_id: int, headers: list[tuple[str, str]], *, end_stream: bool = False) -> None:
        frame = hf.HeadersFrame(stream_id, flags=["END_HEADERS"] + (["END_STREAM"] if end_stream else []))
        frame.data = self.encoder.encode(headers)
        self.send(frame)

    def data(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        frame = hf.DataFrame(stream_id, flags=["END_STREAM"] if end_stream else [])
        frame.data = data
        self.send(frame)

    def call(self, stream_id: int, path: str, body: bytes, **extra: str) -> None:
        """A whole unary request: HEADERS, one message, END_STREAM."""
        self.headers(stream_id, request_headers(path, **extra))
        self.data(stream_id, message(body), end_stream=True)

    def of(self, kind: type[Any], stream_id: int | None = None) -> list[Any]:
        return [s.frame for s in self.frames if isinstance(s.frame, kind) and stream_id in (None, s.frame.stream_id)]

    async def wait_for(self, check: Any, timeout: float = 5.0, what: str = "a frame") -> Any:
        """Wait until ``check(self)`` is truthy (checked on every frame and at the close)."""
        deadline = time.monotonic() + timeout
        while True:
            found = check(self)
            if found:
                return found
            if self.closed:
                raise AssertionError(f"closed before {what}; saw {self.summary()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout} s; saw {self.summary()}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    async def goaway(self, timeout: float = 5.0) -> Any:
        found = await self.wait_for(lambda c: c.of(hf.GoAwayFrame), timeout, "a GOAWAY")
        return found[0]

    async def wait_closed(self, timeout: float = 5.0) -> None:
        await self.wait_for(lambda c: c.closed, timeout, "the close")

    def received_data(self, stream_id: int) -> bytes:
        return b"".join(f.data for f in self.of(hf.DataFrame, stream_id))

    def response_headers(self, stream_id: int) -> list[list[tuple[bytes, bytes]]]:
        """The header blocks received on a stream, decoded in arrival order (every block is decoded
        as it is read, to keep the HPACK table in step)."""
        return [list(h) for h in self._decoded.get(stream_id, [])]

    _decoded: dict[int, list[Any]] = field(default_factory=dict)

    def decode_all(self) -> None:
        """Decode the header blocks not yet decoded (in order: HPACK state is per connection)."""
        done = sum(len(v) for v in self._decoded.values())
        blocks = self.of(hf.HeadersFrame)
        for frame in blocks[done:]:
            self._decoded.setdefault(frame.stream_id, []).append(self.decoder.decode(frame.data, raw=True))

    def summary(self) -> str:
        return ", ".join(_describe(s.frame) for s in self.frames[-20:]) + (" [closed]" if self.closed else "")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.close()


def _describe(frame: Any) -> str:
    name = type(frame).__name__.replace("Frame", "")
    if isinstance(frame, hf.GoAwayFrame):
        return f"GOAWAY(last={frame.last_stream_id}, code={frame.error_code})"
    if isinstance(frame, hf.RstStreamFrame):
        return f"RST({frame.stream_id}, code={frame.error_code})"
    return f"{name}({frame.stream_id}{', ' + ','.join(sorted(frame.flags)) if frame.flags else ''})"
