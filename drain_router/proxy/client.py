"""One client connection of the traffic listener: an asyncio Protocol parsing with llhttp.

It answers ``/livez`` and ``/readyz`` itself and proxies everything else through one
:class:`~drain_router.proxy.exchange.Exchange` per request. Callbacks only: no task, no request or
response object per request.

- **Header timeout**: a request's head must arrive whole within ``--client-header-timeout-secs`` of
  the connection opening (or of its first byte, for later requests), so slowloris clients are closed.
- **Keep-alive idle timeout**: ``--client-keepalive-timeout-secs`` between requests (never during a
  streaming response, never while a body is read). The listener's sweep enforces both.
- **Malformed requests** (llhttp's strict parsing: no smuggling through both Content-Length and
  Transfer-Encoding, no bare LF) get a JSON 400, an oversized head 431; counted ``rejected``, logged
  as one rate-limited line. Only origin-form targets are proxied; HTTP/1.1 needs one ``Host``.
- **Pipelining** is answered in order. At most :data:`MAX_PIPELINED` parsed requests wait for their
  turn; the rest of what the client sent stays unparsed, and reading pauses, until they start (and
  while an upload outpaces the model server), so a pipelining client costs bounded memory. A waiting
  request enters the in-flight count when its turn comes, not when it is parsed.
- **One response per request, in order, even after a mistake**: a malformed request after valid
  ones is answered 400 in its turn, after theirs, and then the connection closes; nothing after a
  request that closes the connection (``Connection: close``, HTTP/1.0) is parsed.
- **Lingering close**: a connection closed with input unread (a 400, 413 or 431, a refused body)
  half-closes after its answer and reads and drops what still comes for
  :data:`BODY_LINGER_SECS`, so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any, Protocol

import httptools

from drain_router import logs
from drain_router.metrics import Outcome
from drain_router.proxy import health, responses
from drain_router.proxy.admission import admit, probe_path
from drain_router.proxy.backpressure import PIPELINE
from drain_router.proxy.exchange import Exchange, Site
from drain_router.proxy.rewrite import forwarded_node
from drain_router.proxy.state import RouterState
from drain_router.proxy.tunnel import Tunnel
from drain_router.proxy.upstream import UpstreamConnection

log = logs.get("drain_router.proxy")

#: A request head larger than this, or with a request line or header longer than MAX_LINE_BYTES, or
#: with more than MAX_HEADERS headers, is answered 431 (aiohttp's line and count limits, and nginx's
#: total of four 8 KiB buffers).
MAX_HEAD_BYTES = 32 * 1024
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128
#: Bytes queued for a client before the model server is no longer read (a stalled reader's bound).
CLIENT_HIGH_WATER_BYTES = 16 * 1024
#: How long a connection closed with part of a request body unread keeps reading (and dropping) it,
#: so the client reads the answer instead of a reset.
BODY_LINGER_SECS = 2.0
#: Parsed requests that may wait for their turn on one connection; what follows them is not parsed
#: (and the connection not read) until one starts.
MAX_PIPELINED = 8

_HEAD_END = b"\r\n\r\n"
#: Outcomes after which the client got a whole answer, so the connection can go on.
ANSWERED = frozenset({Outcome.COMPLETED, Outcome.REJECTED, Outcome.UPSTREAM_ERROR})

Queued = Exchange | tuple[bytes, bytes, bool, bool]


class Listener(Site, Protocol):
    """The traffic listener, as its client connections act on it."""

    @property
    def state(self) -> RouterState: ...
    @property
    def clients(self) -> set[ClientConnection]: ...
    @property
    def tunnels(self) -> set[Tunnel]: ...
    @property
    def tunnels_gone(self) -> asyncio.Event | None: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def keepalive_timeout(self) -> float: ...
    @property
    def timeout_log(self) -> logs.RateLimited: ...
    @property
    def bad_request_log(self) -> logs.RateLimited: ...
    @property
    def bad_target_log(self) -> logs.RateLimited: ...


class HeadTooLarge(Exception):
    """Raised from the parser's callback to stop parsing a head past the limits."""


def _feed(parser: Any, chunk: bytes | memoryview, at: int) -> None:
    """Feed ``chunk``, which starts ``at`` bytes into the read: an upgrade's offset (where what
    follows the handshake starts) is reported from the start of the read, as a whole read's is."""
    try:
        parser.feed_data(chunk)
    except httptools.HttpParserUpgrade as exc:
        raise httptools.HttpParserUpgrade(at + exc.args[0]) from None


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "active",
        "body_left",
        "close_after",
        "current",
        "deadline",
        "deadline_is_head",
        "dropped",
        "head_bytes",
        "head_size",
        "headers",
        "in_head",
        "input_closed",
        "keep_alive",
        "listener",
        "lost_outcome",
        "parser",
        "paused_for",
        "peer",
        "peer_node",
        "queue",
        "resume_scheduled",
        "starting",
        "transport",
        "tunnel",
        "unparsed",
        "upgrading",
        "url",
        "write_paused",
        "ws_early",
    )

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer = self.peer_node = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        """Bytes received while a head is incomplete (bounds a head that never ends)."""
        self.head_size = 0
        """The parsed head's size so far."""
        self.in_head = True
        self.body_left = 0
        """Bytes of the Content-Length body being parsed still to come (no head can start in them)."""
        self.keep_alive = True
        """The request being parsed lets the connection be kept."""
        self.active: Exchange | None = None
        """The exchange whose response is being relayed."""
        self.current: Exchange | None = None
        """The exchange whose request body is being parsed."""
        self.queue: deque[Queued] | None = None
        """Parsed requests waiting for their turn (at most MAX_PIPELINED)."""
        self.unparsed = b""
        """What the client sent after the requests waiting in the queue, parsed once one starts."""
        self.resume_scheduled = False
        self.starting: Exchange | None = None
        """The exchange to start once the read being parsed is parsed whole."""
        self.input_closed = False
        """No more requests are parsed: after one that closes the connection, or a malformed one."""
        self.dropped = False
        """Input was dropped unparsed: closing needs a lingering close, or the answer may be reset."""
        self.close_after = False
        self.lost_outcome = Outcome.CLIENT_ABORTED
        self.paused_for = 0
        self.write_paused = False
        self.deadline: float | None = None
        self.deadline_is_head = True
        self.tunnel: Tunnel | None = None
        """The WebSocket tunnel this connection became, if it did."""
        self.upgrading: Exchange | None = None
        """The WebSocket handshake just parsed (what follows it in the read is held for it)."""
        self.ws_early = b""
        """What the client sent after its WebSocket handshake, before the 101 (one read at most)."""

    # -- the connection --------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        listener = self.listener
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0].encode() if isinstance(peer, tuple) else b""
        self.peer_node = forwarded_node(self.peer)
        listener.clients.add(self)
        transport.set_write_buffer_limits(high=CLIENT_HIGH_WATER_BYTES)
        self.deadline = listener.loop.time() + listener.header_timeout

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.unparsed = b""
        self.listener.clients.discard(self)
        outcome = self.lost_outcome
        for exchange in (self.active, self.current):
            if exchange is not None:
                exchange.abort(outcome)
        while self.queue:
            entry = self.queue.popleft()
            if isinstance(entry, Exchange):
                entry.abort(outcome)

    def eof_received(self) -> bool | None:
        return None  # a half-close is a departure: the upstream request is cancelled

    def pause_writing(self) -> None:  # the client reads slower than the model server writes
        self.write_paused = True
        up = self.active.upstream if self.active is not None else None
        if up is not None and up.transport is not None:
            up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        up = self.active.upstream if self.active is not None else None
        if up is not None and up.transport is not None:
            up.transport.resume_reading()

    def pause_reading(self, reason: int) -> None:
        if not self.paused_for and self.transport is not None:
            self.transport.pause_reading()
        self.paused_for |= reason

    def resume_reading(self, reason: int) -> None:
        if self.paused_for & reason:
            self.paused_for &= ~reason
            if not self.paused_for and self.transport is not None:
                self.transport.resume_reading()

    # -- a WebSocket tunnel ----------------------------------------------------------------------

    def open_tunnel(self, up: UpstreamConnection, early_down: bytes) -> None:
        """The upstream's 101 went to the client: this connection and ``up`` become a tunnel, which
        the active exchange (the handshake) stays in flight for. ``early_down``: what the upstream
        sent after its 101 in the same read."""
        # No HTTP is parsed here again: the parser (and the parsed head) go, which is most of what an
        # idle session would otherwise hold; no header or keep-alive timeout applies to a tunnel.
        del self.parser
        self.headers = []
        self.deadline = None
        self.paused_for = 0
        listener = self.listener
        tunnel = self.tunnel = Tunnel(self, self.transport, up)
        listener.tunnels.add(tunnel)
        listener.metrics.websocket_sessions.inc()
        early_up, self.ws_early = self.ws_early, b""
        tunnel.start(early_up, early_down, client_paused=self.write_paused)
        if listener.state.websocket_close_now:
            tunnel.going_away(None)

    def tunnel_client_lost(self) -> None:
        self.transport = None
        self.listener.clients.discard(self)

    def tunnel_ended(self, tunnel: Tunnel, outcome: Outcome) -> None:
        listener = self.listener
        listener.tunnels.discard(tunnel)
        listener.metrics.websocket_sessions.dec()
        if self.active is not None:
            self.active.finish(outcome)
        if not listener.tunnels and listener.tunnels_gone is not None:
            listener.tunnels_gone.set()

    def closes_after(self, keep_alive: bool) -> bool:
        """Whether the connection closes after the response being written: the client asked, a
        refused request or the closing state asked, or the router is draining."""
        return not keep_alive or self.close_after or self.listener.state.closes_connections

    def close_when_idle(self) -> None:
        self.close_after = True
        if self.active is None and self.in_head and not self.head_bytes and self.transport is not None:
            self.transport.close()

    def deadline_passed(self) -> None:
        self.deadline = None
        if self.transport is None or self.active is not None:
            return  # a response is being relayed: the next deadline is set when it ends
        if self.deadline_is_head:
            listener = self.listener
            listener.metrics.connections_refused.labels("header_timeout").inc()
            listener.timeout_log.emit(header_timeout_secs=listener.header_timeout)
        self.transport.close()

    def abort_for_deadline(self) -> None:
        """The in-flight deadline: the connection is cut, and what waits on it counted with it."""
        self.lost_outcome = Outcome.DEADLINE_ABORTED
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        """Close after the last answer: at once when nothing the client sent is left unread, else
        a lingering close (half-close, then read and drop for BODY_LINGER_SECS)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.deadline = None
        unread = self.dropped or self.unparsed or self.current is not None or not self.in_head or self.head_bytes
        self.input_closed = True
        self.unparsed = b""
        if not unread or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.paused_for = 0
        transport.resume_reading()
        self.listener.loop.call_later(BODY_LINGER_SECS, transport.close)

    # -- parsing ---------------------------------------------------------------------------------

    def data_received(self, data: bytes, resumed: bool = False) -> None:
        """Feed ``data`` to llhttp, then start the request that came first. A read that may hold
        more than one request head is fed one head at a time (:meth:`_feed_heads`).
        ``resumed``: ``data`` is what waited in ``unparsed`` (already counted)."""
        end = len(data)
        if not resumed:
            if self.input_closed or self.unparsed:
                self._held(data)
                return
            if self.in_head:
                self.head_bytes += end
        try:
            # Where the first head in the read ends (-1: none does); the rest of a Content-Length
            # body is not searched (find starts past it, and past the end finds nothing at once).
            cut = data.find(_HEAD_END, self.body_left)
            if (cut < 0 or cut + 4 == end) and not self.queue:  # at most one head, nothing waiting: the usual read
                self.parser.feed_data(data)
            else:
                self._feed_heads(data, cut + 4)
        except httptools.HttpParserUpgrade as exc:
            # Answered 501 (or 400 for CONNECT) in turn; nothing after it is parsed. A WebSocket
            # handshake is forwarded: what followed it in this read is held (reading pauses here,
            # so one read at most) and goes to the upstream after its 101.
            self.input_closed = self.dropped = True
            self.pause_reading(PIPELINE)
            if self.upgrading is not None:
                self.ws_early = data[exc.args[0] :]
                self.upgrading = None
            if self.current is not None:
                self.current.req_done = True
                self.current = None
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, HeadTooLarge):
                self.bad_request(responses.HEAD_TOO_LARGE, "head too large")
            else:  # a bug of ours, raised in a callback: say so loudly, and end this connection
                log.error("proxy.internal_error", error=repr(exc.__context__), exc_info=exc.__context__)
                if self.transport is not None:
                    self.transport.abort()
                return
        except httptools.HttpParserError as exc:
            if self.input_closed:
                self.dropped = True  # bytes after a request that closes the connection: not a request
            else:
                self.bad_request(responses.BAD_REQUEST, str(exc))
        else:
            if self.in_head and self.head_bytes > MAX_HEAD_BYTES and not self.input_closed:
                self.bad_request(responses.HEAD_TOO_LARGE, "head too large")
        if self.starting is not None:
            exchange, self.starting = self.starting, None
            if not exchange.finished:
                exchange.start()

    def _held(self, data: bytes) -> None:
        if self.input_closed:
            self.dropped = True  # after the last request, or lingering: read and dropped
        else:  # reading was paused for the queue; keep the order
            self.unparsed += data

    def _feed_heads(self, data: bytes, cut: int) -> None:
        """Feed ``data`` one request head at a time (llhttp ends a head only at a blank line), so
        that the queue never holds more than MAX_PIPELINED requests: the rest waits in
        ``unparsed``. ``cut``: where the first head ends (3: none does)."""
        parser = self.parser
        at = 0  # what of data is parsed
        end = len(data)
        while True:
            if self.queue and len(self.queue) >= MAX_PIPELINED:
                self.unparsed = data[at:]
                self.pause_reading(PIPELINE)
                return
            if cut < 4 or cut >= end:  # no head ends before the end of this read
                _feed(parser, memoryview(data)[at:] if at else data, at)
                return
            _feed(parser, memoryview(data)[at:cut], at)
            at = cut
            if self.input_closed:
                self.dropped = True
                return
            cut = data.find(_HEAD_END, at + self.body_left) + 4

    def _resume_parse(self) -> None:
        """A queued request started: parse what waited behind it (with the loop's stack clean)."""
        self.resume_scheduled = False
        if self.transport is None or self.input_closed or not self.unparsed:
            return
        data, self.unparsed = self.unparsed, b""
        self.data_received(data, True)
        if not self.unparsed and not self.queue:
            self.resume_reading(PIPELINE)

    def bad_request(self, error: responses.Error, reason: str) -> None:
        """The client sent something llhttp (or the head limit) refuses. The requests before it are
        answered in order, then this error in its turn, and then the connection closes; nothing
        after it is parsed."""
        if self.transport is None:
            return
        self.listener.bad_request_log.emit(status=error[0], reason=reason[:120])
        self.input_closed = self.dropped = True
        self.unparsed = b""
        self.pause_reading(PIPELINE)
        current = self.current
        self.current = None
        if current is None:  # a malformed head, or garbage between requests: a refusal of its own
            refusal = Exchange(self, b"", b"", False, False, None, error)
            if self.active is None and not self.queue:
                self.active = refusal
                refusal.start()
            else:  # after the requests that came first (one of them may still be starting)
                self._enqueue(refusal)
            return
        # The malformed part is this request's body.
        current.req_done = True
        current.keep_alive = False
        if current is self.starting:
            self.starting = None
        if not current.started:
            current.problem = error  # refused in its turn: its head never reaches the model server
            current.discard = True
            if current is self.active:
                current.start()
        elif not current.head_sent:
            current.discard = True
            current.reply(error, Outcome.REJECTED, close=True)
        else:  # its response is streaming already: the status can no longer change
            current.abort(Outcome.REJECTED)
            self.transport.abort()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_size = 0
        if not self.deadline_is_head or self.deadline is None:
            listener = self.listener
            self.deadline = listener.loop.time() + listener.header_timeout
            self.deadline_is_head = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_LINE_BYTES:
            raise HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        size = len(name) + len(value)
        self.head_size += size + 4
        if size > MAX_LINE_BYTES or self.head_size > MAX_HEAD_BYTES or len(self.headers) > MAX_HEADERS:
            raise HeadTooLarge

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        self.deadline = None
        parser = self.parser
        method = parser.get_method()
        version = parser.get_http_version()
        self.keep_alive = parser.should_keep_alive()
        url = self.url
        probe = probe_path(method, url, version)
        if probe is not None:
            entry = (probe, method, self.keep_alive, version == "1.0")
            self.current = None
            if self.active is None and not self.queue:
                self._probe(*entry)
            else:
                self._enqueue(entry)
            return
        listener = self.listener
        verdict = admit(method, url, version, self.headers, self.peer, self.peer_node, listener.pool.host_header)
        request, problem, ws_key = verdict.request, verdict.problem, verdict.ws_key
        if request is not None:
            self.body_left = request.content_length or 0
        if problem is responses.BAD_TARGET:
            listener.bad_target_log.emit(method=method.decode("latin-1"), target=url[:120].decode("latin-1"))
        if verdict.close:
            self.keep_alive = False
        exchange = Exchange(self, method, url, version == "1.0", self.keep_alive, request, problem)
        if ws_key is not None:
            exchange.ws_key = ws_key
            self.upgrading = exchange
        self.current = exchange
        if self.active is None and not self.queue:
            # Started once this read is parsed whole: a request whose body turns out malformed in
            # the same read never reaches the model server, and a body that came along is sent
            # with the head in one write.
            self.active = self.starting = exchange
        else:
            self._enqueue(exchange)

    def on_body(self, body: bytes) -> None:
        if self.body_left:
            self.body_left -= len(body)
        if self.current is not None:
            self.current.request_body(body)

    def on_message_complete(self) -> None:
        self.in_head = True
        self.body_left = 0
        if not self.keep_alive:
            self.input_closed = True  # nothing after a request that closes the connection is a request
        exchange = self.current
        self.current = None
        if exchange is not None:
            exchange.request_done()
            if exchange.finished and self.input_closed and self.active is None:
                self._close()  # the rest of a refused body has been read: the answer is safe

    # -- answering in order ----------------------------------------------------------------------

    def _enqueue(self, entry: Queued) -> None:
        if self.queue is None:
            self.queue = deque()
        self.queue.append(entry)
        self.pause_reading(PIPELINE)  # its body (and what follows) waits for its turn

    def _probe(self, path: bytes, method: bytes, keep_alive: bool, http10: bool) -> None:
        state = self.listener.state
        code, body = state.readiness() if path == b"/readyz" else (200, health.ALIVE)
        close = self.closes_after(keep_alive)
        payload = json.dumps(body).encode()
        if self.transport is not None:
            self.transport.write(
                responses.response(code, payload, close=close, head_only=method == b"HEAD", keep_alive_10=http10)
            )
        self._after_response(close)

    def exchange_finished(self, exchange: Exchange, outcome: Outcome) -> None:
        if exchange is self.active:
            self.active = None
            if self.transport is not None and outcome in ANSWERED:
                self._after_response(exchange.close, unread_body=not exchange.req_done)

    def _after_response(self, close: bool, *, unread_body: bool = False) -> None:
        """A response ended cleanly: close the connection, or answer the next pipelined request, or
        wait for one (under the keep-alive deadline)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if close or self.close_after:
            self.close_after = True
            if unread_body and self.current is not None:
                self.current.discard = True  # read and drop the rest, so the answer is not reset
            self._close()
            return
        if unread_body and self.current is not None:
            self.current.discard = True  # the rest of its body is read and dropped
        queue = self.queue
        while queue:
            entry = queue.popleft()
            if self.unparsed and not self.resume_scheduled:
                self.resume_scheduled = True
                self.listener.loop.call_soon(self._resume_parse)
            elif not queue and not self.unparsed:
                self.resume_reading(PIPELINE)
            if isinstance(entry, Exchange):
                if not entry.finished:
                    self.active = entry
                    entry.start()
                    return
            else:
                self._probe(*entry)
                return  # _probe came back here for the rest
        listener = self.listener
        if self.input_closed:
            if self.active is None and self.current is None:
                self._close()  # the last request has been answered
            return
        if self.current is not None:
            self.deadline = None  # a body is still being read: no timeout applies to a body
        elif self.in_head and not self.head_bytes:
            self.deadline = listener.loop.time() + listener.keepalive_timeout
            self.deadline_is_head = False
        else:
            self.deadline = listener.loop.time() + listener.header_timeout
            self.deadline_is_head = True
