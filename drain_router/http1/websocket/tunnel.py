"""A WebSocket tunnel: after the upstream's 101, the client and upstream connections relay bytes.

Both transports get a :class:`_Side` as their protocol (ordinary requests never pay for it). Bytes
go through as they arrive, one write per read, with back-pressure both ways: a side whose peer's
write buffer is above its high-water mark is not read. A :class:`~drain_router.decisions.websocket.FrameTracker`
per direction follows frame headers only (payloads are never parsed or buffered), so the router can
end a session with Close 1001 at a frame boundary (:meth:`Tunnel.going_away`), and a frame length
with its top bit set closes the tunnel. The upstream connection never returns to the pool.

The tunnel is one request in flight, from the handshake until either side closes: ``completed``
once a Close frame went either way, else ``client_aborted`` or ``upstream_error`` for the side that
vanished; ``deadline_aborted`` when the deadline ended it.

Closing (:meth:`Tunnel.at_closing`) sends the 1001 at once, or with ``idle`` once nothing was read
from either side for ``WEBSOCKET_QUIET_SECS``: each read stamps ``last_read``; one timer per session
checks it, re-armed for when the quiet period would end.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Protocol

from drain_router import logs, tracing
from drain_router.decisions import spans, websocket, websocket_close
from drain_router.decisions.websocket_close import AtClosing
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.http1.websocket.sessions import OpenTunnels
from drain_router.metrics import Outcome

log = logs.get("drain_router.proxy")

_now = time.monotonic

#: How long the router waits, once it sent Close 1001 both ways (or waits for a frame boundary to
#: send it), for the closing handshakes before it closes both connections.
WEBSOCKET_CLOSE_SECS = 2.0


class Host(Protocol):
    """The client connection a tunnel took over: its exchange (the handshake) stays in flight until
    the tunnel ends."""

    def tunnel_client_lost(self) -> None:
        """The client's connection is gone."""

    def tunnel_ended(self, outcome: Outcome) -> None:
        """Both connections are closed: the session ends, counted as ``outcome``."""


class _Side(asyncio.Protocol):
    """One connection of a tunnel; ``tracker`` follows the frames read from it."""

    __slots__ = ("close_frame", "close_sent", "other", "tracker", "transport", "tunnel")

    def __init__(self, tunnel: Tunnel, transport: Any, close_frame: bytes) -> None:
        self.tunnel = tunnel
        self.transport = transport
        self.tracker = websocket.FrameTracker()
        self.close_frame = close_frame
        """The router's Close 1001 to this side (masked when this side is the upstream)."""
        self.other: _Side = self
        self.close_sent = False
        """A Close went to this side (the router's, or its peer's before the router's was due):
        nothing more is relayed to it."""

    def data_received(self, data: bytes) -> None:
        tunnel = self.tunnel
        tunnel.last_read = _now()  # for --websocket-close-at idle: one clock read per read
        other = self.other
        if tunnel.going or tunnel.ending or other.close_sent:
            tunnel.relay(self, data)
            return
        # The hot path of an open session, inlined: follow the frames, pass the bytes on.
        tracker = self.tracker
        tracker.feed(data)
        if tracker.error:
            tunnel.protocol_error(self)
        elif other.transport is not None:
            other.transport.write(data)

    def eof_received(self) -> bool | None:
        return None  # a half-close ends the tunnel

    def pause_writing(self) -> None:  # this side reads slower than the other sends
        if self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.tunnel.lost(self, exc)


class Tunnel:
    __slots__ = (
        "client",
        "ending",
        "going",
        "host",
        "last_read",
        "open_tunnels",
        "outcome",
        "span",
        "timer",
        "up",
        "upstream",
    )

    def __init__(self, host: Host, client_transport: Any, up: UpstreamConnection, open_tunnels: OpenTunnels) -> None:
        """Take over both connections after the 101 was written to the client (their protocols
        become :class:`_Side` s), as one of ``open_tunnels``; :meth:`start` relays what came early."""
        self.host = host
        self.open_tunnels = open_tunnels
        self.up = up
        self.outcome: Outcome | None = None
        self.span: tracing.Span | None = None  # the handshake's (--tracing): the 1001 is an event on it
        self.ending = False
        self.going = False
        self.timer: asyncio.TimerHandle | None = None
        """Before the 1001, ``idle``'s quiet check; after it, the closing handshakes' time limit."""
        self.last_read = _now()
        """``time.monotonic()`` of the last bytes read from either side (the handshake's, at first)."""
        client = self.client = _Side(self, client_transport, websocket.close_frame(websocket.GOING_AWAY))
        upstream = self.upstream = _Side(self, up.transport, websocket.close_frame(websocket.GOING_AWAY, os.urandom(4)))
        client.other, upstream.other = upstream, client
        up.become_tunnel()
        client.transport.set_protocol(client)
        upstream.transport.set_protocol(upstream)
        open_tunnels.add(self)

    def start(self, early_up: bytes, early_down: bytes, *, client_paused: bool) -> None:
        """Relay what each side sent after the handshake before the tunnel existed (``early_up``:
        the client's, held for one read at most; ``early_down``: the upstream's, read with its 101)
        and read the client again. ``client_paused``: the client's writes are above its high-water
        mark, so the upstream is not read until they drain."""
        if client_paused and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()
        if early_up:
            self.relay(self.client, early_up)
        if early_down:
            self.relay(self.upstream, early_down)
        if self.client.transport is not None:
            self.client.transport.resume_reading()

    def relay(self, side: _Side, data: bytes) -> None:
        """Bytes read from ``side``: to the other side, unless the router's Close went there."""
        if self.ending:
            return
        tracker = side.tracker
        other = side.other
        if other.close_sent:  # dropped; only the peer's Close (the closing handshake) is watched
            tracker.feed(data)
            if tracker.closed and side.close_sent and other.tracker.closed:
                self._close_both()
            return
        if self.going:  # a Close 1001 waits for this direction's frame to end
            taken = tracker.feed_to_boundary(data)
        else:
            taken = len(data)
            tracker.feed(data)
        if tracker.error:
            self.protocol_error(side)
            return
        if other.transport is not None:
            other.transport.write(data if taken == len(data) else data[:taken])
        if self.going and tracker.at_boundary:
            self._send_close(other)
            if taken < len(data):
                self.relay(side, data[taken:])

    def protocol_error(self, side: _Side) -> None:
        log.warning("proxy.websocket_frame_too_long", side="client" if side is self.client else "upstream")
        if self.outcome is None:
            self.outcome = Outcome.CLIENT_ABORTED if side is self.client else Outcome.UPSTREAM_ERROR
        self._close_both(abort=True)

    def at_closing(self, action: AtClosing) -> None:
        """Closing started (or this session opened during closing): carry out ``action``."""
        if action is AtClosing.GO_AWAY:
            self.going_away(None)
        elif action is AtClosing.WATCH and self.timer is None:
            self._check_quiet()

    def _check_quiet(self) -> None:
        """Send the 1001 if the session has been quiet both ways long enough, else check again when
        it would have been (a read since then moves that moment on)."""
        self.timer = None
        if self.going or self.ending:
            return
        left = websocket_close.quiet_left(_now(), self.last_read)
        if left <= 0.0:
            self.going_away(None)
        else:
            self.timer = asyncio.get_running_loop().call_later(left, self._check_quiet)

    def going_away(self, outcome: Outcome | None) -> None:
        """End the session with Close 1001 both ways, each at a frame boundary, then wait up to
        :data:`WEBSOCKET_CLOSE_SECS` for the closing handshakes. ``outcome``: what it counts as
        (``deadline_aborted``), or None to count it by how it ends."""
        if outcome is not None:
            self.outcome = outcome
        if self.going or self.ending:
            return
        self.going = True
        if self.timer is not None:  # idle's quiet check
            self.timer.cancel()
        for side in (self.client, self.upstream):
            if side.tracker.at_boundary:
                self._send_close(side.other)
        self.timer = asyncio.get_running_loop().call_later(WEBSOCKET_CLOSE_SECS, self._close_both)

    def _send_close(self, to: _Side, frame: bytes | None = None) -> None:
        """The direction towards ``to`` is at a frame boundary: the router's Close (``frame``, else
        its 1001) goes there, and nothing more is relayed to it. Its own Close frame is watched for
        from here on. A side whose peer's Close was relayed to it already gets none from the router:
        a second Close is a protocol error (RFC 6455 §5.5.1); the closing handshake it is in
        answers for the router's."""
        if to.close_sent:
            return
        to.close_sent = True
        if to.other.tracker.closed:
            return
        if frame is None and to is self.client and self.span is not None:
            self.span.add_event(spans.WEBSOCKET_1001_SENT)
        if to.transport is not None:
            to.transport.write(frame or to.close_frame)

    def lost(self, side: _Side, exc: Exception | None) -> None:
        if side is self.upstream:
            self.up.connection_lost(exc)  # the pool's count
        else:
            self.host.tunnel_client_lost()
        if self.ending:
            return
        if self.outcome is None:
            if self.client.tracker.closed or self.upstream.tracker.closed or self.going:
                self.outcome = Outcome.COMPLETED
            else:
                self.outcome = Outcome.CLIENT_ABORTED if side is self.client else Outcome.UPSTREAM_ERROR
        if self.outcome == Outcome.UPSTREAM_ERROR:
            self._bad_gateway()
        self._close_both()

    def _bad_gateway(self) -> None:
        """The model server's connection was lost without a Close: tell the client with a Close 1014
        (Bad Gateway) when its direction is at a frame boundary, so it sees a failed upstream rather
        than a lost connection (1006)."""
        if self.upstream.tracker.at_boundary:
            self._send_close(self.client, websocket.close_frame(websocket.BAD_GATEWAY))

    def _close_both(self, abort: bool = False) -> None:
        if self.ending:
            return
        self.ending = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for side in (self.client, self.upstream):
            if side.transport is not None:
                if abort:
                    side.transport.abort()
                else:
                    side.transport.close()
        self.open_tunnels.discard(self)
        self.host.tunnel_ended(self.outcome or Outcome.COMPLETED)
