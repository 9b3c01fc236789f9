"""One client connection to the gRPC listener (the router is the HTTP/2 server).

It checks the preface, admits each new stream under the bounds (SPEC 4) and hands it to a
:class:`~drain_router.proxy.grpc.call.Call` (or, for health while the router is not serving, to a
:class:`~drain_router.proxy.grpc.answered.LocalHealth`). Past a rate of resets, SETTINGS or PINGs the
connection gets GOAWAY ENHANCE_YOUR_CALM.

At closing it gets the graceful shutdown of RFC 9113 §6.8 (:meth:`Inbound.shutdown`): GOAWAY with
the largest stream id, a PING, and on its acknowledgement (one round trip: every stream the client
sent before it has arrived) GOAWAY with the last stream id it opened; a stream opened after that is
refused with REFUSED_STREAM, and the connection closes when its last stream ends.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol, cast

from drain_router.metrics import Outcome
from drain_router.proxy.grpc import frames, health
from drain_router.proxy.grpc import rules as r
from drain_router.proxy.grpc.answered import LocalHealth
from drain_router.proxy.grpc.call import Call, Site
from drain_router.proxy.grpc.connection import HPACK_CACHE_ENTRIES, Connection, H2Error, Headers, Leg, flush_all

#: The opaque bytes of the shutdown PING (its acknowledgement ends the first GOAWAY's round trip).
SHUTDOWN_PING = b"drain-rt"
#: How long the final GOAWAY waits for the shutdown PING's acknowledgement from a client that does
#: not answer PINGs (a client that does answers in one round trip).
SHUTDOWN_PING_SECS = 1.0


class Listener(Site, Protocol):
    """What a client connection needs from the listener above it."""

    max_streams: int
    connection_limit: int
    conns: set[Inbound]
    local_health: set[LocalHealth]

    @property
    def serving(self) -> bool: ...

    def opened(self, conn: Inbound) -> None: ...
    def closed(self, conn: Inbound) -> None: ...


class Inbound(Connection):
    CLIENT_SIDE = False

    def __init__(self, listener: Listener) -> None:
        super().__init__()
        self.listener = listener
        now = listener.loop.time()
        self.resets = r.Budget(r.RESETS, now)
        self.settings_budget = r.Budget(r.SETTINGS_FRAMES, now)
        self.pings = r.Budget(r.PINGS, now)
        self.preface = False
        self.first_settings = False
        self.shutdown_stage = 0
        """0 serving; 1 first GOAWAY and the PING sent; 2 final GOAWAY sent."""
        self.ping_timer: asyncio.TimerHandle | None = None
        self.checked: dict[int, tuple[Headers, bytes]] = {}
        """Request header lists already checked, by identity (see :meth:`checked_path`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener = self.listener
        if len(listener.conns) >= listener.connection_limit:
            # Past the descriptor share: told at once (a client retries elsewhere), never registered.
            listener.metrics.connections_refused.labels("grpc_connection_limit").inc()
            transport.write(frames.settings({}) + frames.goaway(0, frames.ENHANCE_YOUR_CALM, b"connection limit"))
            self.closed = True
            transport.close()
            return
        transport.write(self.local_settings())
        listener.opened(self)

    def extra_settings(self) -> dict[int, int]:
        return {frames.MAX_CONCURRENT_STREAMS: self.listener.max_streams}

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ping_timer is not None:
            self.ping_timer.cancel()
        self.listener.closed(self)  # (a refused connection was never registered: a no-op)
        super().connection_lost(exc)

    def before_frames(self) -> bool:
        if self.preface:
            return True
        size = min(len(self.buffer), len(frames.PREFACE))
        if bytes(self.buffer[:size]) != frames.PREFACE[:size]:
            raise H2Error(frames.PROTOCOL_ERROR, "not an HTTP/2 connection preface (h2c prior knowledge only)")
        if size < len(frames.PREFACE):
            return False
        del self.buffer[:size]
        self.preface = True
        return True

    def frame_received(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if not self.first_settings:
            if kind != frames.SETTINGS or flags & frames.ACK:
                raise H2Error(frames.PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
            self.first_settings = True
        super().frame_received(kind, flags, sid, payload)

    # -- bounds -----------------------------------------------------------------------------------

    def calm(self, budget: r.Budget, what: str) -> None:
        if not budget.spend(self.listener.loop.time()):
            raise H2Error(frames.ENHANCE_YOUR_CALM, f"too many {what}")

    def reset_received(self, sid: int, code: int) -> None:
        self.calm(self.resets, "stream resets")
        super().reset_received(sid, code)

    def settings_received(self) -> None:
        self.calm(self.settings_budget, "SETTINGS frames")

    def ping_received(self) -> None:
        self.calm(self.pings, "PING frames")

    def refuse(self, sid: int, code: int = frames.REFUSED_STREAM) -> None:
        """Refuse a new stream (it never reaches the model server); refusals count as resets."""
        self.queue(frames.rst_stream(sid, code))
        self.note_reset(sid)
        self.calm(self.resets, "refused streams")

    # -- streams ----------------------------------------------------------------------------------

    def new_stream(self, sid: int, headers: Headers, end: bool) -> None:
        if sid % 2 == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "a client's stream ids are odd")
        if sid <= self.last_peer_stream:
            if sid in self.reset_streams:
                return  # sent before the peer saw the router's RST_STREAM: ignored (§5.1)
            raise H2Error(frames.PROTOCOL_ERROR, "a new stream id must be higher than the last")
        self.last_peer_stream = sid
        listener = self.listener
        if self.shutdown_stage == 2 or len(self.legs) >= listener.max_streams:
            self.refuse(sid)
            return
        try:
            path = self.checked_path(headers)
        except r.Malformed:
            listener.metrics.count_grpc("none", Outcome.REJECTED, 0.0)
            self.refuse(sid, frames.PROTOCOL_ERROR)
            return
        leg: Leg
        if path in health.PATHS and not listener.serving:
            local = LocalHealth(self, sid, path, listener.local_health.discard)
            leg = local.down
            self.legs[sid] = leg
            if end:
                leg.remote_closed = True
            listener.local_health.add(local)
            local.start(end)
            return
        call = Call(listener, self, sid, headers, path, end, counted=path not in health.PATHS)
        leg = call.down
        self.legs[sid] = leg
        if end:
            leg.remote_closed = True
        if call.watch:
            listener.watches.add(call)
        call.start()

    def checked_path(self, headers: Headers) -> bytes:
        """The request's ``:path`` once its fields are checked (:func:`rules.request`). A header list
        decoded from a remembered block is the same object each time (never changed after decoding):
        its check is remembered with it, held so its identity cannot be reused."""
        known = self.checked.get(id(headers))
        if known is not None and known[0] is headers:
            return known[1]
        path = r.request(headers)
        if len(self.checked) >= HPACK_CACHE_ENTRIES:
            self.checked.clear()
        self.checked[id(headers)] = (headers, path)
        return path

    def leg_gone(self, leg: Leg | None) -> None:
        if self.shutdown_stage == 2 and not self.legs:
            self.close()

    # -- the graceful shutdown --------------------------------------------------------------------

    def shutdown(self) -> None:
        """RFC 9113 §6.8: GOAWAY(2^31-1) and a PING now; the final GOAWAY when the PING comes back."""
        if self.shutdown_stage or self.closed:
            return
        self.shutdown_stage = 1
        self.queue(frames.goaway(frames.MAX_STREAM_ID, frames.NO_ERROR))
        self.queue(frames.ping(SHUTDOWN_PING))
        self.ping_timer = self.listener.loop.call_later(SHUTDOWN_PING_SECS, self.final_goaway)

    def ping_acked(self, opaque: bytes) -> None:
        if opaque == SHUTDOWN_PING:
            self.final_goaway()

    def final_goaway(self) -> None:
        if self.shutdown_stage != 1 or self.closed:
            return
        self.shutdown_stage = 2
        if self.ping_timer is not None:
            self.ping_timer.cancel()
            self.ping_timer = None
        self.queue(frames.goaway(self.last_peer_stream, frames.NO_ERROR))
        if not self.legs:
            self.close()
        flush_all()
