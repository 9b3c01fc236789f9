"""The upstream leg: one pool of keep-alive HTTP/1.1 connections to the model server.

Each :class:`UpstreamConnection` is an asyncio Protocol parsing responses with llhttp (httptools).
Its callbacks only record what arrived on the :class:`~drain_router.proxy.exchange.Exchange` that owns the
connection; the exchange acts once per read (:meth:`Exchange.flush`), so one upstream read is one
write to the client. A task is made only to open a new connection.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections import deque
from typing import TYPE_CHECKING, Any

import httptools

from drain_router import config, logs
from drain_router.metrics import Outcome
from drain_router.proxy import responses, websocket

if TYPE_CHECKING:
    from drain_router.proxy.exchange import Exchange

log = logs.get("drain_router.proxy")

#: Receive buffer of each upstream socket. The model server is in the same pod (microseconds away),
#: so a small window costs no throughput, and it bounds what one read can pull in while the client
#: on the other side has stopped reading (the kernel would otherwise autotune it to megabytes).
UPSTREAM_RCVBUF_BYTES = 16 * 1024
#: Request body bytes queued for the model server before the client is no longer read (upload
#: back-pressure: the transport's high-water mark).
UPSTREAM_HIGH_WATER_BYTES = 64 * 1024

#: Pooled connections idle longer than this are closed by the router: below the keep-alive timeout
#: of uvicorn (5 s), which vLLM and SGLang serve with, so the model server never closes a connection
#: the router is about to reuse (a POST written to it could not be retried).
UPSTREAM_IDLE_SECS = 4.0

_EMFILE = frozenset({errno.EMFILE, errno.ENFILE})


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

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        """Bytes received while the response head is incomplete (bounds a head that never ends)."""
        self.head_timer: asyncio.TimerHandle | None = None
        self.in_head = True
        self.interim = False
        self.keep_alive = True
        self.complete = True
        """The parser is between responses (not after a HEAD response's head, say)."""
        self.switching: list[tuple[bytes, bytes]] | None = None
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

    def start(self, exchange: Exchange, head: bytes) -> None:
        """Hand the connection to ``exchange`` and write its request head (and any buffered body)."""
        self.exchange = exchange
        if not self.complete:
            self.parser = httptools.HttpResponseParser(self)
            self.complete = True
        # (Its headers list is empty: a connection is handed on only after a whole response.)
        self.in_head = True
        self.transport.write(head)

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

    def _head_pending(self, exchange: Exchange, read: int) -> None:
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

    def _invalid(self, exchange: Exchange, exc: BaseException) -> None:
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
        exchange.response_body(body)  # type: ignore[union-attr]

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


#: Why a client connection is not being read (a bit each; reading resumes when none is left).
UPLOAD = 1
PIPELINE = 2
PENDING = 4


class UpstreamPool:
    """Idle connections (last in, first out), a connection cap (``--upstream-max-connections``, 0 =
    none) with a queue of exchanges waiting for one, and the connect with its timeout."""

    def __init__(self, cfg: config.Config, note_connect: Any) -> None:
        proxy = cfg.proxy
        self.upstream = proxy.upstream
        self.host_header = self.upstream.base_url.split("://", 1)[1].encode()
        """``Host`` for a request that came without one (HTTP/1.0)."""
        self.connect_timeout = float(proxy.upstream_connect_timeout_secs)
        self.max_connections = proxy.upstream_max_connections
        self.note_connect = note_connect
        self.loop = asyncio.get_running_loop()
        self.surplus_log = logs.RateLimited(log, "proxy.upstream_surplus", level="warning")
        self.idle: list[UpstreamConnection] = []
        self.open = 0
        self.waiting: deque[Exchange] = deque()
        self.connections: set[UpstreamConnection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._addresses: list[Any] | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    def acquire(self, exchange: Exchange) -> None:
        """Give ``exchange`` a connection now, or once one is free (``exchange.attach``)."""
        idle = self.idle
        while idle:
            up = idle.pop()
            up.idle_at = None
            if up.transport is not None and not up.transport.is_closing():
                exchange.attach(up, reused=True)
                return
        if self.max_connections and self.open >= self.max_connections:
            self.waiting.append(exchange)
            return
        self._spawn_connect(exchange)

    def _spawn_connect(self, exchange: Exchange) -> None:
        self.open += 1
        task = asyncio.ensure_future(self._connect(exchange))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    def release(self, up: UpstreamConnection) -> None:
        up.exchange = None
        while self.waiting:
            exchange = self.waiting.popleft()
            if not exchange.finished:
                exchange.attach(up, reused=True)
                return
        up.idle_at = asyncio.get_running_loop().time()
        self.idle.append(up)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(UPSTREAM_IDLE_SECS / 2, self._close_stale)

    def _close_stale(self) -> None:
        """Close the pooled connections idle for longer than :data:`UPSTREAM_IDLE_SECS` (the oldest
        are first in the list: reuse takes the newest)."""
        self._sweeper = None
        idle = self.idle
        horizon = asyncio.get_running_loop().time() - UPSTREAM_IDLE_SECS
        stale = 0
        while stale < len(idle) and (idle[stale].idle_at or 0.0) <= horizon:
            stale += 1
        for up in idle[:stale]:
            up.idle_at = None
            if up.transport is not None:
                up.transport.close()
        del idle[:stale]
        if idle:
            self._sweeper = asyncio.get_running_loop().call_later(UPSTREAM_IDLE_SECS / 2, self._close_stale)

    def lost(self, up: UpstreamConnection) -> None:
        self.connections.discard(up)
        if up.idle_at is not None:  # no scan of the idle list for the (common) busy connection
            up.idle_at = None
            self.idle.remove(up)
        self._closed_one()

    def _closed_one(self) -> None:
        self.open -= 1
        while self.waiting and (not self.max_connections or self.open < self.max_connections):
            exchange = self.waiting.popleft()
            if not exchange.finished:
                self._spawn_connect(exchange)

    async def open_connection(self) -> UpstreamConnection:
        """A new connection to the model server (TCP with a small receive buffer, or a Unix socket)."""
        loop = asyncio.get_running_loop()
        factory = lambda: UpstreamConnection(self)
        if self.upstream.unix_path is not None:
            _, up = await loop.create_unix_connection(factory, self.upstream.unix_path)
            return up
        if self._addresses is None:
            self._addresses = await loop.getaddrinfo(self.upstream.host, self.upstream.port, type=socket.SOCK_STREAM)
        last: OSError | None = None
        for family, type_, proto, _, address in self._addresses:
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UPSTREAM_RCVBUF_BYTES)
                await loop.sock_connect(sock, address)
                _, up = await loop.create_connection(factory, sock=sock)
                return up
            except OSError as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        self._addresses = None  # resolve again next time
        raise last or OSError("no address for the upstream")

    async def _connect(self, exchange: Exchange) -> None:
        try:
            up = await asyncio.wait_for(self.open_connection(), self.connect_timeout)
        except TimeoutError:
            self._closed_one()
            self.note_connect(False)
            log.warning("proxy.upstream_timeout", path=exchange.path)
            exchange.fail(responses.CONNECT_TIMEOUT, Outcome.UPSTREAM_ERROR)
            return
        except OSError as exc:
            self._closed_one()
            if exc.errno in _EMFILE:
                log.error("proxy.emfile", error=str(exc), inflight=exchange.inflight_count())
                exchange.fail(responses.OUT_OF_FDS, Outcome.UPSTREAM_ERROR)
                return
            self.note_connect(False)
            log.warning("proxy.upstream_error", error=repr(exc), path=exchange.path)
            exchange.fail(responses.UNREACHABLE, Outcome.UPSTREAM_ERROR)
            return
        except BaseException:
            self._closed_one()
            raise
        self.note_connect(True)
        self.connections.add(up)
        if exchange.finished:  # the client left (or the deadline hit) while connecting
            self.release(up)
            return
        exchange.attach(up, reused=False)

    def close(self) -> None:
        """At exit: close every connection (in-flight ones were finished or aborted before)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in self._connecting:
            task.cancel()
        for up in self.idle:
            up.idle_at = None
        self.idle.clear()
        for up in list(self.connections):
            if up.transport is not None:
                up.transport.abort()
