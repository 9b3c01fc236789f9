"""One keep-alive HTTP/1.1 connection to the model server (the pool that holds them: :mod:`.pool`).

Each :class:`UpstreamConnection` is an asyncio Protocol parsing responses with llhttp (httptools).
Its callbacks only record what arrived on the :class:`Owner` (the request's exchange) that holds the
connection; the owner acts once per read (``flush``), so one upstream read is one write to the
client. What the connection needs from the layers above it is declared here, as protocols
(:class:`Owner`, :class:`Pool`): it imports none of them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httptools

from drain_router import logs
from drain_router.decisions import websocket
from drain_router.http1.backpressure import UPLOAD, Reader

#: Request body bytes queued for the model server before the client is no longer read (upload
#: back-pressure: the transport's high-water mark).
UPSTREAM_HIGH_WATER_BYTES = 64 * 1024

#: The upstream's response head is bounded like a client's request head: its size and header count
#: (the same limits as requests), and the time from its first byte to its end. Interim (1xx)
#: responses count with the final head they precede, in bytes and in time. Past a bound the client
#: gets 502 and the upstream connection is closed.
MAX_RESPONSE_HEAD_BYTES = 32 * 1024
MAX_RESPONSE_HEADERS = 128
RESPONSE_HEAD_SECS = 10.0


class BadResponse(Exception):
    """Raised from a parser callback: the upstream's response breaks a rule (the reason is logged,
    never sent); the client gets 502 if it can still be told, and the connection is closed."""


class Surplus(Exception):
    """Raised from a parser callback once the exchange's final response is whole (its
    ``resp_done``): bytes past its framed end (a second response, a body on 204/304 or on a HEAD
    answer). They are never relayed; the connection closes."""


Headers = list[tuple[bytes, bytes]]


class Owner(Protocol):
    """The request that holds a connection (an exchange): told what each read brought, then
    ``flush``-ed once per read."""

    resp_done: bool
    """Its final response is whole: set here when llhttp ends it."""
    to_client: list[bytes]
    """What this read brings the client: the body's bytes are appended here as llhttp hands them
    over (the owner frames them for the client in ``flush``)."""

    @property
    def code(self) -> int: ...
    @property
    def ws_key(self) -> bytes | None: ...
    @property
    def client(self) -> Reader: ...

    def response_interim(self, status: int, headers: Headers) -> None: ...
    def response_head(self, status: int, headers: Headers) -> None: ...
    def flush(self) -> None: ...
    def switch(self, up: UpstreamConnection, headers: Headers, rest: bytes) -> None: ...
    def upstream_lost(self, exc: BaseException | None, *, invalid: bool = False) -> None: ...


class Pool(Protocol):
    """The pool a connection belongs to: told when it closes."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def surplus_log(self) -> logs.RateLimited: ...

    def lost(self, up: UpstreamConnection) -> None: ...
    def done_with(self, up: UpstreamConnection, reusable: bool, completed: bool, paused: bool) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One connection to the model server; owned by at most one exchange at a time."""

    __slots__ = (
        "complete",
        "exchange",
        "head_bytes",
        "head_timer",
        "headers",
        "idle_at",
        "in_head",
        "interim",
        "keep_alive",
        "parser",
        "pool",
        "switching",
        "transport",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Owner | None = None
        self.headers: Headers = []
        self.head_bytes = 0
        """Bytes received while the response head is incomplete (bounds a head that never ends)."""
        self.head_timer: asyncio.TimerHandle | None = None
        self.in_head = True
        self.interim = False
        self.keep_alive = True
        self.complete = True
        """The parser is between responses (not after a HEAD response's head, say)."""
        self.switching: Headers | None = None
        """The headers of a valid 101 answering a WebSocket handshake, until the tunnel takes over."""
        self.idle_at: float | None = None
        """When it went back to the pool; None while it is not in the idle list."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=UPSTREAM_HIGH_WATER_BYTES)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._stop_head_timer()
        self.pool.lost(self)
        exchange = self.exchange
        if exchange is not None:
            self.exchange = None
            exchange.upstream_lost(exc)

    def pause_writing(self) -> None:  # the model server reads the upload slower than the client sends it
        if self.exchange is not None:
            self.exchange.client.pause_reading(UPLOAD)

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.resume_reading(UPLOAD)

    def start(self, exchange: Owner, head: bytes) -> None:
        """Hand the connection to ``exchange`` and write its request head (and any buffered body)."""
        self.exchange = exchange
        if not self.complete:
            self.parser = httptools.HttpResponseParser(self)
            self.complete = True
        # (Its headers list is empty: a connection is handed on only after a whole response.)
        self.in_head = True
        self.transport.write(head)

    def become_tunnel(self) -> None:
        """After a 101, a WebSocket tunnel reads this connection: it parses HTTP no more, so its
        parser goes (most of what an idle session would otherwise hold), and nobody owns it."""
        self.exchange = None
        del self.parser
        self.headers = []

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        # Bytes nobody asked for (none owns the connection, or its final response is whole already):
        # the connection is out of step.
        if exchange is None or exchange.resp_done:
            self.keep_alive = False
            self.transport.abort()
            return
        self.complete = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self.switching is not None:  # a valid 101: the connection becomes a tunnel
                self._stop_head_timer()
                headers, self.switching = self.switching, None
                exchange.switch(self, headers, data[exc.args[0] :])
                return
            if not exchange.resp_done:
                self._invalid(exchange, exc.__context__ or exc)
                return
            self.keep_alive = False
            self.pool.surplus_log.emit(status=exchange.code)
        except httptools.HttpParserError as exc:
            if not exchange.resp_done:
                self._invalid(exchange, exc.__context__ or exc)
                return
            # The final response is whole (a HEAD answer's with its head); whatever followed it, even
            # bytes llhttp refuses, is surplus: dropped with the connection, never relayed.
            self.keep_alive = False
            self.pool.surplus_log.emit(status=exchange.code)
        if self.in_head or self.head_timer is not None:
            self._head_pending(exchange, len(data))
        exchange.flush()

    def _head_pending(self, exchange: Owner, read: int) -> None:
        """After a read that left the response head unfinished (or finished one that had its timer):
        bound its bytes (counting the whole read: bytes before a head's end are its) and its time."""
        if not self.in_head:
            self._stop_head_timer()
            return
        self.head_bytes += read
        if self.head_bytes > MAX_RESPONSE_HEAD_BYTES:
            self._invalid(exchange, BadResponse("response head too large"))
        elif self.head_timer is None:
            self.head_timer = self.pool.loop.call_later(RESPONSE_HEAD_SECS, self._head_timed_out)

    def _invalid(self, exchange: Owner, exc: BaseException) -> None:
        self.exchange = None
        self.keep_alive = False
        self.transport.abort()  # connection_lost stops the head timer
        exchange.upstream_lost(exc, invalid=True)

    def _head_timed_out(self) -> None:
        self.head_timer = None
        exchange = self.exchange
        if exchange is not None and self.in_head and self.transport is not None:
            self._invalid(exchange, BadResponse(f"response head not complete within {RESPONSE_HEAD_SECS} s"))

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    # llhttp callbacks: record only; the exchange acts in flush(). (No on_status: the status line
    # the client gets carries the standard reason phrase; RFC 9112 lets a client ignore it.)
    def on_message_begin(self) -> None:
        if self.exchange.resp_done:  # type: ignore[union-attr]  # a message after the final response
            raise Surplus

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        headers = self.headers
        if not 200 <= status <= 599 or len(headers) > MAX_RESPONSE_HEADERS:
            self._unusual_head(status)
            return
        # The final head (its bytes were bounded as they arrived, in data_received).
        self.in_head = False
        self.head_bytes = 0
        self.keep_alive = self.parser.should_keep_alive()
        exchange = self.exchange
        exchange.response_head(status, headers)  # type: ignore[union-attr]  # set while parsing
        self.headers = []  # trailers, if any, are dropped

    def _unusual_head(self, status: int) -> None:
        """A head that is not a final response's within the bounds: an interim one, or a 502."""
        if len(self.headers) > MAX_RESPONSE_HEADERS:
            raise BadResponse("too many response headers")
        if not 100 <= status <= 599:
            raise BadResponse(f"status {status} out of range")
        if status == 101:
            key = self.exchange.ws_key if self.exchange is not None else None
            if key is None:  # nobody asked to switch
                raise BadResponse("101 Switching Protocols without a WebSocket handshake")
            if not websocket.accept_matches(key, self.headers):
                raise BadResponse("101 Switching Protocols without the Sec-WebSocket-Accept that answers the key")
            self.in_head = False
            self.keep_alive = False  # never back to the pool
            self.switching = self.headers
            self.headers = []
            return
        # An interim response: the head goes on (its bytes and time count with the final head's).
        self.interim = True
        exchange = self.exchange
        if exchange is not None and status != 100:  # 100 Continue was the router's own to send
            exchange.response_interim(status, self.headers)
        self.headers = []

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange.resp_done:  # type: ignore[union-attr]  # set while parsing; a HEAD answer's body
            raise Surplus
        exchange.to_client.append(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        if self.switching is not None:
            return
        if self.interim:
            self.interim = False
            self.headers = []
            return
        self.complete = True
        exchange = self.exchange
        if exchange is not None:
            exchange.resp_done = True
