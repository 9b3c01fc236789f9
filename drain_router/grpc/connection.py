"""The I/O around one HTTP/2 connection: an asyncio Protocol that feeds the sans-IO core
(:class:`~drain_router.h2.connection.Connection`) and writes what it gathered.

Output is written once per turn of the loop: a connection with output joins its listener's
:class:`Flusher`, which is flushed at the end of every read and every timer, so what one read relays
to several connections goes out in one write each. Every close is a lingering close
(:mod:`drain_router.lingering`: half-close, then read and drop until the peer's FIN or for a while),
so the peer reads the last frames (a connection error's GOAWAY, the last call's trailers at the
process's exit) instead of a reset caused by what it is still sending; a failed connection whose
peer does not read is cut at once (its transport would never finish closing).
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from drain_router import lingering
from drain_router.h2.connection import Connection
from drain_router.h2.rules import Request
from drain_router.h2.streams import Headers, Stream
from drain_router.http1.client import BODY_LINGER_SECS


class Flusher:
    """The connections of one listener (client and model-server side) with output gathered during
    this turn of the loop."""

    __slots__ = ("dirty",)

    def __init__(self) -> None:
        self.dirty: list[Wire] = []

    def flush(self) -> None:
        dirty = self.dirty
        while dirty:
            dirty.pop().flush()


class Wire(asyncio.Protocol):
    """One connection's transport and its core; the roles (inbound, outbound) add their events."""

    core: Connection

    def __init__(self, flusher: Flusher) -> None:
        self.flusher = flusher
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.lingering = False

    def attach(self, transport: asyncio.BaseTransport) -> asyncio.Transport:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.transport

    # -- the core's events ------------------------------------------------------------------------

    def output_ready(self) -> None:
        self.flusher.dirty.append(self)

    def connection_failed(self) -> None:
        """The GOAWAY goes out with the next flush, then the lingering close."""

    def stream_gone(self) -> None: ...
    def settings_applied(self, values: dict[int, int]) -> None: ...
    def ping_acked(self, opaque: bytes) -> None: ...
    def goaway_received(self, last_stream: int, code: int) -> None: ...

    def stream_requested(self, stream: Stream, headers: Headers, request: Request, end: bool) -> None:
        raise NotImplementedError  # the server role's (never reached for the client role: see Connection.new_stream)

    def request_rejected(self) -> None: ...

    # -- output -----------------------------------------------------------------------------------

    def flush(self) -> None:
        core = self.core
        output = core.output
        transport = self.transport
        if output.queued:
            data = output.data_to_send()
            if transport is not None and not self.lingering:
                transport.write(data)
        if core.failed and not self.lingering and transport is not None:
            if output.paused:
                self.cut()  # a peer that does not read would hold a closing transport forever
            else:
                self.linger()

    def close(self) -> None:
        """Close after what is gathered is written (a graceful end: every stream is done)."""
        self.flush()
        self.linger()

    def linger(self) -> None:
        """The lingering close: nothing more is written or read (what arrives is dropped); closed at
        the peer's FIN, or cut after BODY_LINGER_SECS."""
        if self.transport is not None and not self.lingering:
            self.lingering = True
            lingering.linger(self.transport, BODY_LINGER_SECS, cut=True)

    def cut(self) -> None:
        """Closed at once: what is not sent yet is dropped (the peer sees a reset)."""
        self.lingering = True
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.core.output.pause()

    def resume_writing(self) -> None:
        core = self.core
        core.output.resume()
        for stream in list(core.streams.values()):
            stream.handler.on_writable(stream)
        self.flusher.flush()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # read and dropped until the peer's FIN
        self.core.receive(data, self.loop.time())
        self.flusher.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.core.lost()
        self.flusher.flush()
