"""A raw-socket model server for protocol-level tests: it writes its answers byte by byte as the test
chooses, so a test controls the framing (Content-Length, chunked with extensions and trailers,
close-delimited, no body, 1xx), when a connection closes, and when a request body is read.

It counts what the router did to it: connections accepted, requests seen (with the connection each
came on), connections the router closed. Unlike the fake model's testing kit (aiohttp) and
``bench/upstream.py`` (one fixed set of fast answers), nothing here is normalised by a framework.

Routes (the path; query parameters as noted):

- ``/cl?size=N``: 200 with a Content-Length body of N bytes (:func:`pattern`); HEAD: the same head,
  no body. Written in 64 KiB pieces, each awaited (a client that stops reading holds it back).
- ``/chunked``: 200 chunked, with chunk extensions and a trailer; the body is :data:`CHUNKED_BODY`.
- ``/burst?n=N``: 200 chunked, the head and N chunks (``event {i}\n``) and the last chunk written in
  one write, so the router reads them together.
- ``/close?size=N``: 200 with neither Content-Length nor Transfer-Encoding: the body ends when this
  server closes the connection (no ``Connection: close`` either).
- ``/status/{code}``: that status and no body (304 also with a Content-Length, as RFC 9110 allows).
- ``/continue``: a ``100 Continue`` interim response, then the body is read and echoed as ``/echo``.
- ``/echo``: reads the body; 200 JSON ``{"method", "target", "size", "sha256", "headers"}``.
- ``/stale``: answers like ``/echo``, then treats its connection as one it closed while idle: the
  next request arriving on it is read and dropped by closing the socket, without an answer (the
  race of a pooled connection closed by the server as the proxy reuses it).
- ``/idle-close``: answers like ``/echo`` (keep-alive, no ``Connection: close``), then closes the
  connection at once: an idle keep-alive connection closed by the server.
- ``/upload``: reads nothing of the body until :attr:`RawUpstream.resume_upload` is set, then reads
  it all and answers like ``/echo`` (a slow model server: back-pressure on uploads).
- ``/silent``: never answers; waits for the router to close the connection and counts it in
  :attr:`RawUpstream.peer_closed` (a long prefill).
- ``.../completions``, ``.../responses``, ``/sse``: the stream the test put in
  :attr:`RawUpstream.stream` (a :class:`Stream`: its pieces, framing, content type, pauses; whether
  the connection is held open after it, a stream that never ends).
- ``/health``: a health path whose answers the test scripts, one per poll: each poll counts in
  :attr:`RawUpstream.health_polls` and waits for its item of :attr:`RawUpstream.health_answers`,
  ``(delay, status)``: that status with an empty body, ``delay`` seconds later (longer than the
  router's timeout: a poll that times out). A poll waiting for its item is held, so the router's
  verdict on the polls before it can be read at leisure.
- anything else: 404, empty body.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qs

#: The body of ``/chunked`` once its framing is removed.
CHUNKED_BODY = b"hello, chunked world"
#: ``/chunked`` on the wire: an extension on each chunk, a trailer after the last one.
CHUNKED_WIRE = (
    b'5;ext=1\r\nhello\r\n2;name="quoted;value"\r\n, \r\nD\r\nchunked world\r\n0;last\r\nX-Trailer: done\r\n\r\n'
)
assert len(b"chunked world") == 0xD


def burst_events(n: int) -> list[bytes]:
    """The chunks of ``/burst?n=N``, each one event."""
    return [b"event %d\n" % i for i in range(n)]


def pattern(size: int) -> bytes:
    """``size`` bytes that are not all alike, so a lost, doubled or reordered piece shows."""
    unit = bytes(range(256)) * 256  # 64 KiB
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class Stream:
    """What the streaming routes answer: ``pieces`` written one at a time (``pause`` seconds apart:
    each its own read at the router; 0: all in one write), framed as ``framing`` says: ``chunked``
    (each piece one chunk, then the last chunk), ``cut`` (chunked, then the connection closes
    without the last chunk: a crash), ``close`` (the body ends with the connection) or ``length`` (a
    Content-Length of the whole). ``hold``: after the pieces, neither end the body
    nor close, until the router closes the connection."""

    pieces: list[bytes]
    framing: str = "chunked"
    content_type: bytes = b"text/event-stream"
    status: int = 200
    pause: float = 0.02
    hold: bool = False


@dataclass
class Seen:
    """One request as it reached the upstream."""

    conn: int
    method: str
    target: str
    version: str
    headers: dict[str, str]
    answered: bool = False

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass
class RawUpstream:
    port: int = 0
    accepted: int = 0
    """Connections accepted from the router."""
    peer_closed: int = 0
    closed_idle: int = 0
    """Connections the router closed between requests (an idle pooled connection)."""
    """Connections the router closed while this server still held them open (``/silent``)."""
    seen: list[Seen] = field(default_factory=list)
    resume_upload: asyncio.Event = field(default_factory=asyncio.Event)
    upload_started: asyncio.Event = field(default_factory=asyncio.Event)
    silent_started: asyncio.Event = field(default_factory=asyncio.Event)
    peer_closed_event: asyncio.Event = field(default_factory=asyncio.Event)
    health_answers: asyncio.Queue[tuple[float, int]] = field(default_factory=asyncio.Queue)
    health_polls: int = 0
    """Polls of ``/health`` received, the one waiting for its answer included."""
    stream: Stream = field(default_factory=lambda: Stream([b"data: [DONE]\n\n"]))
    """What the streaming routes answer."""
    stream_held: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a ``hold`` stream has written its pieces."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = self.accepted
        self._writers.add(writer)
        drop_next = False
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_idle += 1
                    return
                request = _parse(conn, head)
                self.seen.append(request)
                if drop_next:
                    return  # closed in finally, unanswered
                keep = await self._route(request, reader, writer)
                request.answered = True
                if not keep:
                    return
                if request.path == "/stale":
                    drop_next = True
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _route(self, request: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to be closed."""
        path, query = request.path, parse_qs(request.target.partition("?")[2])
        if path == "/cl":
            await _read_body(request, reader)
            size = int(query.get("size", ["100"])[0])
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % size
            )
            if request.method != "HEAD":
                await _write_pattern(writer, size)
            await writer.drain()
            return True
        if path == "/chunked":
            await _read_body(request, reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            if request.method != "HEAD":
                writer.write(CHUNKED_WIRE)
            await writer.drain()
            return True
        if path == "/burst":
            await _read_body(request, reader)
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in burst_events(int(query.get("n", ["32"])[0])))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + chunks
                + b"0\r\n\r\n"
            )
            await writer.drain()
            return True
        if path == "/close":
            await _read_body(request, reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
            if request.method != "HEAD":
                await _write_pattern(writer, int(query.get("size", ["100"])[0]))
            await writer.drain()
            return False
        if path.startswith("/status/"):
            await _read_body(request, reader)
            code = int(path.rsplit("/", 1)[1])
            extra = b'Content-Length: 42\r\nETag: "v1"\r\n' if code == 304 else b""
            writer.write(b"HTTP/1.1 %d Status\r\n%s\r\n" % (code, extra))
            await writer.drain()
            return True
        if path == "/continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await _echo(request, reader, writer)
            return True
        if path in ("/echo", "/stale"):
            await _echo(request, reader, writer)
            return True
        if path == "/idle-close":
            await _echo(request, reader, writer)
            return False
        if path == "/upload":
            self.upload_started.set()
            await self.resume_upload.wait()
            await _echo(request, reader, writer)
            return True
        if path.endswith(("/completions", "/responses")) or path == "/sse":
            await _read_body(request, reader)
            return await self._stream(self.stream, reader, writer)
        if path == "/health":
            self.health_polls += 1
            delay, status = await self.health_answers.get()
            await asyncio.sleep(delay)  # the answer's lateness is what is under test
            writer.write(b"HTTP/1.1 %d Health\r\nContent-Length: 0\r\n\r\n" % status)
            await writer.drain()
            return True
        if path == "/silent":
            self.silent_started.set()
            await reader.read()  # until the router closes its side
            self.peer_closed += 1
            self.peer_closed_event.set()
            return False
        await _read_body(request, reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    async def _stream(self, stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        framing = {
            "chunked": b"Transfer-Encoding: chunked\r\n",
            "cut": b"Transfer-Encoding: chunked\r\n",
            "close": b"",
            "length": b"Content-Length: %d\r\n" % sum(map(len, stream.pieces)),
        }[stream.framing]
        writer.write(b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\n%s\r\n" % (stream.status, stream.content_type, framing))
        chunked = stream.framing in ("chunked", "cut")
        wire = [b"%x\r\n%s\r\n" % (len(p), p) if chunked else p for p in stream.pieces if p]
        if stream.pause:
            for piece in wire:
                await writer.drain()
                await asyncio.sleep(stream.pause)
                writer.write(piece)
        else:
            writer.write(b"".join(wire))
        if stream.hold:
            await writer.drain()
            self.stream_held.set()
            await reader.read()  # until the router closes its side
            return False
        if stream.framing == "chunked":
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        return stream.framing not in ("close", "cut")


def _parse(conn: int, head: bytes) -> Seen:
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Seen(conn=conn, method=method, target=target, version=version, headers=headers)


async def _read_body(request: Seen, reader: asyncio.StreamReader) -> bytes:
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return bytes(body)
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(request.headers.get("content-length", "0"))
    return await reader.readexactly(length) if length else b""


async def _echo(request: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    body = await _read_body(request, reader)
    answer = json.dumps(
        {
            "method": request.method,
            "target": request.target,
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "headers": request.headers,
        }
    ).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer)
    )
    await writer.drain()


async def _write_pattern(writer: asyncio.StreamWriter, size: int) -> None:
    piece = pattern(64 * 1024)
    while size > 0:
        writer.write(piece[:size])
        size -= len(piece)
        await writer.drain()


@asynccontextmanager
async def running() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    try:
        yield upstream
    finally:
        server.close()
        for writer in list(upstream._writers):
            writer.transport.abort()
        await server.wait_closed()
