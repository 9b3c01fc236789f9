"""One client connection to the gRPC listener (the router is the HTTP/2 server).

It admits each new stream under the bounds and hands it to a
:class:`~drain_router.grpc.call.Call` (or, for health while the router is not serving, to a
:class:`~drain_router.grpc.answered.LocalHealth`); its core pays for frames that cost work
without progress from the client's budgets. A connection that sends no preface within the client
header timeout, or has no stream for the keep-alive timeout, gets GOAWAY and is closed.

At closing it gets the graceful shutdown of RFC 9113 §6.8 (:meth:`Inbound.shutdown`): GOAWAY with
the largest stream id, a PING, and on its acknowledgement (one round trip: every stream the client
sent before it has arrived) GOAWAY with the last stream id it opened; a stream opened after that is
refused with REFUSED_STREAM, and the connection closes when its last stream ends.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sized
from typing import Protocol

from drain_router import tracing
from drain_router.decisions import spans
from drain_router.grpc import health, traced
from drain_router.grpc.answered import LocalHealth
from drain_router.grpc.call import Call, Site
from drain_router.grpc.connection import Wire
from drain_router.h2 import frames
from drain_router.h2 import rules as r
from drain_router.h2.connection import Connection
from drain_router.h2.rules import Request
from drain_router.h2.streams import Exit, Headers, Stream
from drain_router.metrics import Outcome

#: The opaque bytes of the shutdown PING (its acknowledgement ends the first GOAWAY's round trip).
SHUTDOWN_PING = b"drain-rt"
#: How long the final GOAWAY waits for the shutdown PING's acknowledgement from a client that does
#: not answer PINGs (a client that does answers in one round trip).
SHUTDOWN_PING_SECS = 1.0


class Stage(enum.Enum):
    """Where a client connection is in its own shutdown."""

    WAITING = "waiting for the preface"
    SERVING = "serving"
    GOING_AWAY = "first GOAWAY and PING sent"
    LAST_GOAWAY = "final GOAWAY sent: no new stream"
    CLOSED = "closed"


class Sites(Protocol):
    """A listener's destinations when calls name where they go (the activator's services)."""

    def pick(self, conn: Connection, stream: Stream, headers: Headers, request: Request, end: bool) -> Site | None:
        """The site of a new call, or None when it was answered already (refused, never held)."""


class Listener(Site, Protocol):
    """What a client connection needs from the listener above it."""

    sites: Sites | None

    max_streams: int
    connection_limit: int
    conns: set[Inbound]
    counted: Sized
    local_health: set[LocalHealth]
    preface_timeout: float
    idle_timeout: float
    tracer: tracing.Tracer | None

    @property
    def serving(self) -> bool: ...

    def opened(self, conn: Inbound) -> None: ...
    def closed(self, conn: Inbound) -> None: ...


class Inbound(Wire):
    def __init__(self, listener: Listener) -> None:
        super().__init__(listener.flusher)
        self.listener = listener
        self.core = Connection(
            self, client_side=False, budgets=r.Budgets(self.loop.time()), max_backlog=r.MAX_QUEUED_OUTPUT_BYTES
        )
        self.core.max_streams = listener.max_streams
        self.stage = Stage.WAITING
        self.timer: asyncio.TimerHandle | None = None
        """The preface timeout, then the idle timeout, then the shutdown PING's."""
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = self.attach(transport)
        listener = self.listener
        if len(listener.counted) >= listener.connection_limit:
            # Past the descriptor share: told at once (a client retries elsewhere), never registered.
            listener.metrics.connections_refused.labels("grpc_connection_limit").inc()
            transport.write(frames.settings({}) + frames.goaway(0, frames.ENHANCE_YOUR_CALM, b"connection limit"))
            self.stage = Stage.CLOSED
            self.core.failed = True
            transport.close()
            return
        self.core.initiate()
        self.timer = self.loop.call_later(listener.preface_timeout, self.preface_timed_out)
        listener.opened(self)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stage = Stage.CLOSED
        if self.timer is not None:
            self.timer.cancel()
        self.listener.closed(self)  # (a refused connection was never registered: a no-op)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.stage is Stage.WAITING and self.core.settings_seen:
            self.stage = Stage.SERVING
            self.idle_since = self.loop.time()
            self.rearm(self.listener.idle_timeout, self.idle_check)

    # -- timeouts ---------------------------------------------------------------------------------

    def rearm(self, delay: float, then: Callable[[], None]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(delay, then)

    def go_away(self, reason: bytes) -> None:
        """GOAWAY NO_ERROR with the last stream opened, then close (no stream is open)."""
        self.core.control(frames.goaway(self.core.last_peer_stream, frames.NO_ERROR, reason))
        self.stage = Stage.CLOSED
        self.close()

    def preface_timed_out(self) -> None:
        self.timer = None
        if self.stage is Stage.WAITING:
            self.go_away(b"no connection preface in time")

    def idle_check(self) -> None:
        """A connection with no stream for the keep-alive timeout is closed (as gRPC servers do with
        ``max_connection_idle``: GOAWAY, then close); one with streams is checked again later."""
        self.timer = None
        if self.stage is not Stage.SERVING:
            return
        timeout = self.listener.idle_timeout
        if self.core.streams:
            self.rearm(timeout, self.idle_check)
            return
        left = self.idle_since + timeout - self.loop.time()
        if left > 0:
            self.rearm(left, self.idle_check)
            return
        self.go_away(b"idle")

    # -- the core's events ------------------------------------------------------------------------

    def connection_failed(self) -> None:
        self.stage = Stage.CLOSED

    def request_rejected(self) -> None:
        self.listener.metrics.count_grpc("none", Outcome.REJECTED, 0.0)

    def stream_requested(self, stream: Stream, headers: Headers, request: Request, end: bool) -> None:
        listener = self.listener
        core = self.core
        if self.stage is Stage.LAST_GOAWAY or len(core.streams) > listener.max_streams:
            core.stream_error(stream, stream.sid, frames.REFUSED_STREAM, Exit.REFUSED)
            return
        path = request.path
        if path in health.PATHS and not listener.serving:
            local = LocalHealth(core, stream, path, listener.local_health.discard)
            listener.local_health.add(local)
            local.start(end)
            return
        site: Site = listener
        if listener.sites is not None:  # (the activator: each call names its service)
            picked = listener.sites.pick(core, stream, headers, request, end)
            if picked is None:
                return  # answered at once
            site = picked
        tracer = listener.tracer  # (--tracing: None when off; health calls have no span)
        if tracer is None or path in health.PATHS:
            call = Call(site, core, stream, headers, request, end, counted=path not in health.PATHS)
        else:
            call = traced.call(tracer, site, core, stream, headers, request, end)
        if call.boundaries is not None:
            listener.watches.add(call)
        if call.counted and site.gate is not None and not call.admit(site.gate):
            return  # it waits for a slot (it starts when given one), or was refused
        call.start()

    def stream_gone(self) -> None:
        if not self.core.streams:
            if self.stage is Stage.LAST_GOAWAY:
                self.stage = Stage.CLOSED
                self.close()
            else:
                self.idle_since = self.loop.time()

    def ping_acked(self, opaque: bytes) -> None:
        if opaque == SHUTDOWN_PING:
            self.final_goaway()

    # -- the graceful shutdown --------------------------------------------------------------------

    def shutdown(self) -> None:
        """RFC 9113 §6.8: GOAWAY(2^31-1) and a PING now; the final GOAWAY when the PING comes back."""
        if self.stage is not Stage.SERVING and self.stage is not Stage.WAITING:
            return
        self.stage = Stage.GOING_AWAY
        self.core.control(frames.goaway(frames.MAX_STREAM_ID, frames.NO_ERROR))
        if self.listener.tracer is not None:
            tracing.event_each([s.handler for s in self.core.streams.values()], spans.GOAWAY_SENT)
        self.core.control(frames.ping(SHUTDOWN_PING))
        self.rearm(SHUTDOWN_PING_SECS, self.final_goaway)

    def final_goaway(self) -> None:
        if self.stage is not Stage.GOING_AWAY:
            return
        self.stage = Stage.LAST_GOAWAY
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.core.control(frames.goaway(self.core.last_peer_stream, frames.NO_ERROR))
        if not self.core.streams:
            self.stage = Stage.CLOSED
            self.close()
        self.flusher.flush()
