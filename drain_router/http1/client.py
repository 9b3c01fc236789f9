"""One client connection of the traffic listener. The :class:`~.reader.RequestReader` it holds
turns what llhttp parses into exchanges; the connection answers ``/livez`` and ``/readyz`` itself and each request
in its turn (a waiting one enters the in-flight count when its turn comes), keeps the header timeout
(a head must arrive whole within ``--client-header-timeout-secs``: slowloris) and the keep-alive
idle timeout (never during a response or a body) for the listener's sweep, and closes: a connection
with input unread (a 400, 413 or 431, a refused body) half-closes after its answer and reads and
drops for :data:`BODY_LINGER_SECS`, so the client reads the answer instead of a reset. After the
upstream's 101 it hosts a WebSocket tunnel (:mod:`.websocket.tunnel`). A half-close is a departure (asyncio
closes the transport). Callbacks only: no task per request."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from drain_router import lingering, logs
from drain_router.http1 import answers
from drain_router.http1.exchange import Exchange
from drain_router.http1.heads import forwarded_node
from drain_router.http1.reader import Reading, RequestReader
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.http1.websocket.sessions import OpenTunnels
from drain_router.http1.websocket.tunnel import Tunnel
from drain_router.metrics import Outcome
from drain_router.state import ALIVE, RouterState

log = logs.get("drain_router.proxy")

#: Bytes queued for a client before the model server is no longer read (a stalled reader's bound).
CLIENT_HIGH_WATER_BYTES = 16 * 1024
#: How long a connection closed with part of a request body unread keeps reading (and dropping) it,
#: so the client reads the answer instead of a reset.
BODY_LINGER_SECS = 2.0
#: Outcomes after which the client got a whole answer, so the connection can go on.
ANSWERED = frozenset({Outcome.COMPLETED, Outcome.REJECTED, Outcome.UPSTREAM_ERROR})


class Finished(Protocol):
    """A request that ended, as its connection goes on after it."""

    @property
    def close(self) -> bool: ...
    @property
    def req_done(self) -> bool: ...


class Listener(Reading, Protocol):
    """The traffic listener, as its client connections act on it."""

    @property
    def state(self) -> RouterState: ...
    @property
    def clients(self) -> set[ClientConnection]: ...
    @property
    def tunnels(self) -> OpenTunnels: ...
    @property
    def keepalive_timeout(self) -> float: ...
    @property
    def timeout_log(self) -> logs.RateLimited: ...


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "active",
        "close_after",
        "deadline",
        "deadline_is_head",
        "listener",
        "lost_outcome",
        "paused_for",
        "peer",
        "peer_node",
        "reader",
        "transport",
        "tunnel",
        "write_paused",
    )

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: Any = None
        self.peer = self.peer_node = b""
        self.close_after = False
        self.lost_outcome = Outcome.CLIENT_ABORTED
        self.paused_for = 0
        self.write_paused = False
        self.tunnel: Tunnel | None = None
        """The WebSocket tunnel this connection became, if it did."""
        self.active: Exchange | None = None
        """The exchange whose response is being relayed (the next parsed one waits for its turn)."""
        self.deadline: float | None = None
        """When the head being read (or the keep-alive wait) times out; the listener's sweep checks it."""
        self.deadline_is_head = True
        self.reader = RequestReader(self)

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

    def data_received(self, data: bytes) -> None:
        self.reader.received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        reader = self.reader
        reader.unparsed = b""
        self.listener.clients.discard(self)
        outcome = self.lost_outcome
        for exchange in (self.active, reader.current):
            if exchange is not None:
                exchange.abort(outcome)
        queue = reader.queue
        while queue:
            entry = queue.popleft()
            if isinstance(entry, Exchange):
                entry.abort(outcome)

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
        early_up = self.reader.stop()
        self.deadline = None  # no header or keep-alive timeout applies to a tunnel
        self.paused_for = 0
        listener = self.listener
        tunnel = self.tunnel = Tunnel(self, self.transport, up, listener.tunnels)
        tunnel.start(early_up, early_down, client_paused=self.write_paused)
        if listener.state.websocket_at_closing is not None:
            tunnel.at_closing(listener.state.websocket_at_closing)

    def tunnel_client_lost(self) -> None:
        self.transport = None
        self.listener.clients.discard(self)

    def tunnel_ended(self, outcome: Outcome) -> None:
        if self.active is not None:
            self.active.finish(outcome)

    def closes_after(self, keep_alive: bool) -> bool:
        """Whether the connection closes after the response being written: the client asked, a
        refused request or the closing state asked, or the router is draining."""
        return not keep_alive or self.close_after or self.listener.state.closes_connections

    def close_when_idle(self) -> None:
        self.close_after = True
        reader = self.reader
        if self.active is None and reader.in_head and not reader.head_bytes and self.transport is not None:
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

    def close(self) -> None:
        """Close after the last answer: at once when nothing the client sent is left unread, else
        a lingering close (half-close, then read and drop for BODY_LINGER_SECS)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.deadline = None
        reader = self.reader
        unread = (
            reader.dropped or reader.unparsed or reader.current is not None or not reader.in_head or reader.head_bytes
        )
        reader.input_closed = True
        reader.unparsed = b""
        if not unread:
            transport.close()
            return
        if lingering.linger(transport, BODY_LINGER_SECS):
            self.paused_for = 0
            transport.resume_reading()

    # -- answering in order ----------------------------------------------------------------------

    def answer_probe(self, path: bytes, method: bytes, keep_alive: bool, http10: bool) -> None:
        state = self.listener.state
        code, body = state.readiness() if path == b"/readyz" else (200, ALIVE)
        close = self.closes_after(keep_alive)
        payload = json.dumps(body).encode()
        if self.transport is not None:
            self.transport.write(
                answers.response(code, payload, close=close, head_only=method == b"HEAD", keep_alive_10=http10)
            )
        self._after_response(close)

    def exchange_finished(self, exchange: Finished, outcome: Outcome) -> None:
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
        reader = self.reader
        current = reader.current
        if close or self.close_after:
            self.close_after = True
            if unread_body and current is not None:
                current.discard = True  # read and drop the rest, so the answer is not reset
            self.close()
            return
        if unread_body and current is not None:
            current.discard = True  # the rest of its body is read and dropped
        queue = reader.queue
        while queue:
            entry = queue.take()
            if isinstance(entry, Exchange):
                if not entry.finished:
                    self.active = entry
                    entry.start()
                    return
            else:
                self.answer_probe(*entry)
                return  # answer_probe came back here for the rest
        listener = self.listener
        if reader.input_closed:
            if self.active is None and reader.current is None:
                self.close()  # the last request has been answered
            return
        if reader.current is not None:
            self.deadline = None  # a body is still being read: no timeout applies to a body
        elif reader.in_head and not reader.head_bytes:
            self.deadline = listener.loop.time() + listener.keepalive_timeout
            self.deadline_is_head = False
        else:
            self.deadline = listener.loop.time() + listener.header_timeout
            self.deadline_is_head = True
