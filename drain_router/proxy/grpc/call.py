"""One relayed stream, from the client's HEADERS to its end both ways: counted in flight exactly.

A :class:`Call` pairs the client's stream (``down``) with one stream to the model server (``up``) and
relays headers, data, trailers and resets one to one. It enters the in-flight count when it starts
and leaves exactly once (:meth:`Call.finish`), with the outcome of SPEC 5: ``completed`` when the
response's end went out to the client (whatever its ``grpc-status``), ``client_aborted`` when the
client reset the stream or left (the model server's stream is reset at once, so the engine aborts
the generation), ``upstream_error`` for the model server's failures, ``deadline_aborted`` for the
drain deadline (the client gets ``grpc-status: 14``, retryable). Health calls relayed while serving
are calls that never count.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from drain_router import logs
from drain_router.metrics import Metrics, Outcome
from drain_router.proxy.grpc import frames, health
from drain_router.proxy.grpc import rules as r
from drain_router.proxy.grpc.connection import Connection, Headers, Leg, flush_all
from drain_router.proxy.grpc.outbound import Outbound
from drain_router.proxy.grpc.pool import GrpcPool
from drain_router.proxy.state import InFlight

log = logs.get("drain_router.grpc")

UNAVAILABLE = 14
DEADLINE_EXCEEDED = 4
DEADLINE_MESSAGE = "the router's drain deadline was reached (the pod is terminating); retry on another replica"
UPSTREAM_LOST_MESSAGE = "the model server's connection was lost"
UNREACHABLE_MESSAGE = "the model server is unreachable"
INVALID_MESSAGE = "the model server sent an invalid response"


class Site(Protocol):
    """What a call needs from the listener it came through."""

    inflight: InFlight
    pool: GrpcPool
    metrics: Metrics
    access_log: bool
    loop: asyncio.AbstractEventLoop
    watches: set[Call]
    """Health Watch calls relayed while serving (they get NOT_SERVING at SIGTERM)."""


def unavailable_head(message: str, *, head_sent: bool) -> Headers:
    """The trailers that end a gRPC call with UNAVAILABLE (a trailers-only response before any head)."""
    trailers = health.trailers(UNAVAILABLE, message)
    return trailers if head_sent else health.response_head() + trailers


class Call:
    __slots__ = (
        "counted",
        "down",
        "ending",
        "finished",
        "grpc",
        "head_seen",
        "headers",
        "msg_left",
        "path",
        "prefix",
        "request_end",
        "site",
        "started_at",
        "status",
        "timer",
        "to_not_serving",
        "up",
        "waiting",
        "watch",
    )

    def __init__(
        self, site: Site, conn: Connection, sid: int, headers: Headers, path: bytes, end: bool, *, counted: bool
    ) -> None:
        self.site = site
        self.down = Leg(conn, sid, self)
        self.up: Leg | None = None
        self.headers = headers
        self.path = path
        self.request_end = end
        self.grpc = r.is_grpc(headers)
        self.counted = counted
        self.watch = path == health.WATCH
        self.waiting: list[tuple[bytes, bool]] = []
        """Request data that arrived before the stream to the model server was open."""
        self.status: str | None = None
        self.head_seen = False
        self.finished = False
        self.ending: Outcome | None = None
        """The outcome to finish with once the end the router sent goes out."""
        self.started_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.msg_left = 0
        self.prefix = b""
        self.to_not_serving = False

    def start(self) -> None:
        site = self.site
        self.started_at = site.loop.time()
        if self.counted:
            site.inflight.enter(self)
        timeout = r.grpc_timeout(self.headers)
        if timeout is not None:
            self.timer = site.loop.call_later(timeout, self.timed_out)
        site.pool.acquire(self)

    # -- pool.Waiter ------------------------------------------------------------------------------

    def connected(self, conn: Outbound) -> None:
        if self.finished:
            return
        waiting, self.waiting = self.waiting, []
        self.up = up = conn.open(self, self.headers, self.request_end and not waiting)
        for data, end in waiting:
            self.acknowledge(self.down, conn.send_data(up, data, end), conn)
        flush_all()

    def unreachable(self, reason: str) -> None:
        self.end_unavailable(UNREACHABLE_MESSAGE, Outcome.UPSTREAM_ERROR)
        flush_all()

    # -- connection.Relay -------------------------------------------------------------------------

    def on_data(self, leg: Leg, data: bytes, end: bool) -> None:
        if leg is self.down:
            up = self.up
            if up is None:
                self.waiting.append((data, end))
                return
            self.acknowledge(leg, up.conn.send_data(up, data, end), up.conn)
            return
        down = self.down
        if self.watch:
            self.track_messages(data)
        self.acknowledge(leg, down.conn.send_data(down, data, end), down.conn)
        if self.to_not_serving and self.msg_left == 0 and not self.prefix:
            self.not_serving()

    def on_headers(self, leg: Leg, headers: Headers, end: bool) -> None:
        if leg is self.down:  # request trailers
            if self.up is not None:
                self.up.conn.send_headers(self.up, headers, end)
            return
        try:
            if self.head_seen:
                r.trailers(headers)
            elif 100 <= r.response(headers) < 200:
                return  # an informational head: gRPC has none, and it is not relayed
        except r.Malformed as exc:
            log.warning("grpc.upstream_invalid", path=self.path.decode("latin-1"), error=str(exc))
            leg.conn.reset(leg, frames.PROTOCOL_ERROR)
            self.up = None
            self.end_unavailable(INVALID_MESSAGE, Outcome.UPSTREAM_ERROR)
            return
        if end:
            self.status = r.grpc_status(headers)
        self.head_seen = True
        self.down.conn.send_headers(self.down, headers, end)

    def on_reset(self, leg: Leg, code: int) -> None:
        if leg is self.down:
            self.finish(Outcome.CLIENT_ABORTED)
            return
        self.up = None
        if not self.finished:
            # One to one: REFUSED_STREAM (the model server's GOAWAY) stays REFUSED_STREAM, which a
            # gRPC client retries transparently.
            self.down.conn.reset(self.down, code)
            self.finish(Outcome.UPSTREAM_ERROR)

    def on_lost(self, leg: Leg) -> None:
        if leg is self.down:
            self.finish(Outcome.CLIENT_ABORTED)
            return
        self.up = None
        if not self.finished:
            self.end_unavailable(UPSTREAM_LOST_MESSAGE, Outcome.UPSTREAM_ERROR)

    def on_invalid(self, leg: Leg) -> None:
        if leg is self.down:
            self.finish(Outcome.CLIENT_ABORTED)
            return
        self.up = None
        log.warning("grpc.upstream_invalid", path=self.path.decode("latin-1"), error="flow control")
        self.end_unavailable(INVALID_MESSAGE, Outcome.UPSTREAM_ERROR)

    def on_sent(self, leg: Leg, n: int) -> None:
        source = self.down if leg is self.up else self.up
        if source is not None:
            self.acknowledge(source, n, leg.conn)

    def on_end_sent(self, leg: Leg) -> None:
        if leg is self.down:
            self.finish(self.ending or Outcome.COMPLETED)

    def on_writable(self, leg: Leg) -> None:
        source = self.down if leg is self.up else self.up
        if source is not None and source.owed:
            owed, source.owed = source.owed, 0
            source.conn.grant(source, owed)

    def acknowledge(self, source: Leg, n: int, target: Connection) -> None:
        """``n`` bytes of ``source`` went into the other side's transport: re-open ``source``'s window,
        or owe it until that transport takes its buffer (a reader that does not read)."""
        if n:
            if target.write_paused:
                source.owed += n
            else:
                source.conn.grant(source, n)

    # -- endings ----------------------------------------------------------------------------------

    def end_unavailable(self, message: str, outcome: Outcome) -> None:
        """End the call for the client with ``grpc-status: 14`` (a gRPC call) or RST_STREAM CANCEL."""
        if self.finished:
            return
        self.ending = outcome
        down = self.down
        if self.grpc and not down.local_closed and down.sid in down.conn.legs:
            self.status = str(UNAVAILABLE)
            down.conn.send_headers(down, unavailable_head(message, head_sent=self.head_seen), True)
            return  # finish() follows when the trailers go out
        down.conn.reset(down, frames.CANCEL)
        self.finish(outcome)

    def abort_deadline(self) -> None:
        """The drain deadline: what waits for the client's window is dropped, the trailers go now."""
        self.down.conn.discard_pending(self.down)
        self.end_unavailable(DEADLINE_MESSAGE, Outcome.DEADLINE_ABORTED)
        self.finish(Outcome.DEADLINE_ABORTED)
        flush_all()

    def timed_out(self) -> None:
        """The call's own ``grpc-timeout`` passed (it was passed on too; whichever end sees it first)."""
        self.timer = None
        if self.finished:
            return
        down = self.down
        self.ending = Outcome.COMPLETED
        self.status = str(DEADLINE_EXCEEDED)
        trailers = health.trailers(DEADLINE_EXCEEDED, "deadline exceeded")
        down.conn.discard_pending(down)
        down.conn.send_headers(down, trailers if self.head_seen else health.response_head() + trailers, True)
        flush_all()

    def finish(self, outcome: Outcome) -> None:
        """Leave the in-flight count (exactly once); reset whatever of the two streams is still open."""
        if self.finished:
            return
        self.finished = True
        site = self.site
        if self.watch:
            site.watches.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        duration = site.loop.time() - self.started_at
        if self.counted:
            site.inflight.leave(self)
            site.metrics.count_grpc(self.status or "none", outcome, duration)
        if site.access_log and self.counted:
            log.info(
                "grpc.call",
                method=self.path.decode("latin-1"),
                grpc_status=self.status,
                outcome=outcome,
                duration_s=round(duration, 6),
            )
        down = self.down
        if down.sid in down.conn.legs:
            # The response is whole but the client is still sending: it may stop (RFC 9113 §8.1).
            down.conn.reset(down, frames.NO_ERROR if outcome == Outcome.COMPLETED else frames.CANCEL)
        up = self.up
        if up is not None and up.sid in up.conn.legs:
            up.conn.reset(up, frames.CANCEL)
        if up is None:
            site.pool.cancel(self)
        site.pool.released()

    # -- health Watch relayed while serving ------------------------------------------------------

    def track_messages(self, data: bytes) -> None:
        """Follow the gRPC message boundaries of a relayed Watch, so NOT_SERVING can be put between
        two messages."""
        i, size = 0, len(data)
        while i < size:
            if self.msg_left == 0:
                need = 5 - len(self.prefix)
                self.prefix += data[i : i + need]
                i += need
                if len(self.prefix) == 5:
                    self.msg_left = int.from_bytes(self.prefix[1:5], "big")
                    self.prefix = b""
            else:
                take = min(self.msg_left, size - i)
                self.msg_left -= take
                i += take

    def not_serving(self) -> None:
        """SIGTERM: a Watch relayed while serving gets NOT_SERVING from the router at once (at the
        next message boundary) and is no longer relayed."""
        if self.finished or self.down.local_closed:
            return
        if self.msg_left or self.prefix:
            self.to_not_serving = True
            return
        self.to_not_serving = False
        up, self.up = self.up, None
        if up is not None and up.sid in up.conn.legs:
            up.conn.reset(up, frames.CANCEL)
        down = self.down
        if not self.head_seen:
            self.head_seen = True
            down.conn.send_headers(down, health.response_head(), False)
        down.conn.send_data(down, health.message(health.NOT_SERVING), False)
        self.site.pool.released()
