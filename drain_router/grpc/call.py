"""One relayed stream, from the client's HEADERS to its end both ways: counted in flight exactly.

A :class:`Call` pairs the client's stream (``down``) with one stream to the model server (``up``) and
relays headers, data, trailers and resets one to one. It enters the in-flight count when it starts
and leaves exactly once (:meth:`Call.finish`), with its outcome: ``completed`` when the
response's end went out to the client (whatever its ``grpc-status``), ``client_aborted`` when the
client reset the stream, broke the protocol on it, or left (the model server's stream is reset at
once, so the engine aborts the generation), ``upstream_error`` for the model server's failures,
``deadline_aborted`` for the drain deadline (the client gets ``grpc-status: 14``, retryable). Health
calls relayed while serving never count. Each stream tells the call once that it left its
connection (:meth:`Call.on_closed`), whatever the cause: where every way out of a call meets.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from drain_router import headers, logs, tracing
from drain_router.admission.gate import Gate
from drain_router.admission.ticket import Ticket
from drain_router.decisions import capacity, spans
from drain_router.decisions.capacity import Reason
from drain_router.decisions.grpc_status import GrpcStatus
from drain_router.grpc import answers, health
from drain_router.grpc.connection import Flusher
from drain_router.grpc.outbound import Outbound
from drain_router.grpc.pool import GrpcPool
from drain_router.grpc.watch import MessageBoundaries
from drain_router.h2 import frames
from drain_router.h2 import rules as r
from drain_router.h2.connection import Connection
from drain_router.h2.streams import Exit, Headers, State, Stream
from drain_router.metrics import Metrics, Outcome
from drain_router.state import InFlight

log = logs.get("drain_router.grpc")


PUSHBACK = b"grpc-retry-pushback-ms"
REFUSED = headers.REFUSED.encode()


class Site(Protocol):
    """What a call needs from the listener it came through."""

    metrics: Metrics
    flusher: Flusher
    loop: asyncio.AbstractEventLoop
    answers: dict[Reason, tuple[GrpcStatus, str]]
    """The status and message of each refusal at the gate (the router's
    :data:`~drain_router.decisions.capacity.GRPC_ANSWERS`)."""
    inflight: InFlight
    pool: GrpcPool | None
    """None only while its gate holds every call (an activator's service asleep)."""
    access_log: bool
    watches: set[Call]  # health Watch calls relayed while serving (they get NOT_SERVING at SIGTERM)

    @property
    def gate(self) -> Gate | None: ...


class Call:
    __slots__ = (
        "boundaries",
        "counted",
        "down",
        "down_conn",
        "ending",
        "finished",
        "head_seen",
        "headers",
        "pool",
        "request",
        "request_end",
        "site",
        "started_at",
        "status",
        "ticket",
        "timer",
        "up",
        "up_conn",
        "waiting",
    )

    def __init__(
        self,
        site: Site,
        conn: Connection,
        stream: Stream,
        headers: Headers,
        request: r.Request,
        end: bool,
        *,
        counted: bool,
    ) -> None:
        self.site = site
        self.down = stream
        stream.handler = self
        self.down_conn = conn
        self.up: Stream | None = None
        self.up_conn: Connection | None = None
        self.headers = headers
        self.request = request
        self.request_end = end
        self.counted = counted
        self.boundaries = MessageBoundaries() if request.path == health.WATCH else None
        """Where a relayed health Watch is between messages (None: not a Watch)."""
        self.waiting: list[tuple[bytes | Headers, bool]] = []
        """What arrived from the client while no stream to the model server was open: data, and
        trailers (a header list), in order. Bounded by the stream's window (none of it is granted)."""
        self.status: str | None = None
        self.head_seen = False
        self.finished = False
        self.ticket: Ticket | None = None
        """Its place at the gate (a counted call, with ``--max-concurrent-requests``)."""
        self.ending: Outcome | None = None  # the outcome to finish with once the end the router sent goes out
        self.started_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.pool: GrpcPool | None = None  # its site's as it started (an activator's site changes pool)

    # -- admission ------------------------------------------------------------------------------

    speaks_grpc = True

    def admit(self, gate: Gate) -> bool:
        """A new counted call: True when it starts now (a slot); False when it waits for one (not
        counted while it waits: what the client sends meanwhile waits in the call, held by flow
        control) or was refused."""
        ticket = self.ticket = Ticket(gate, self)
        self.counted = False
        if ticket.admit():
            self.counted = True
            return True
        return False

    def admitted(self) -> None:
        """Given a slot after waiting: it starts at once."""
        self.counted = True
        self.start()

    def refused(self, reason: Reason, retry_after: float) -> None:
        """Trailers-only: RESOURCE_EXHAUSTED (queue full, or waited past ``--queue-timeout-secs``) or
        UNAVAILABLE (closing), with ``grpc-retry-pushback-ms``; counted ``rejected``."""
        status, message = self.site.answers[reason]
        if reason is Reason.CLOSING:
            tracing.event(self, spans.REFUSED_CLOSING)
        self.reject(status, message, capacity.headers(retry_after)[1], refused=reason.value)

    def answer(self, words: tuple[GrpcStatus, str]) -> None:
        """Ended while it waited, with an answer of the activator's."""
        self.reject(*words)

    def reject(self, status: int, message: str, pushback_ms: int | None = None, *, refused: str | None = None) -> None:
        """The call ends before it reached any model server: trailers-only with ``status`` and
        ``message`` (and ``grpc-retry-pushback-ms`` when given; ``x-drain-router-refused: <refused>``
        for admission's refusals), or REFUSED_STREAM for an h2c stream that is not a gRPC call;
        counted ``rejected``, never in flight."""
        self.counted = False  # never in flight: counted here
        self.status = str(status)
        site = self.site
        site.metrics.count_grpc(self.status, Outcome.REJECTED, 0.0)
        self.ending = Outcome.REJECTED
        down, conn = self.down, self.down_conn
        if self.request.grpc and conn.sending(down):
            ending = answers.ending(status, message, head_sent=False)
            if pushback_ms is not None:
                ending.append((PUSHBACK, b"%d" % pushback_ms))
            if refused is not None:
                ending.append((REFUSED, refused.encode("ascii")))
            conn.send_headers(down, ending, True)
        else:  # not a gRPC call (an h2c stream): refused as a stream, which a client may retry
            conn.reset(down, frames.REFUSED_STREAM)
            self.finish(Outcome.REJECTED)
        site.flusher.flush()

    # -- relaying -------------------------------------------------------------------------------

    def start(self) -> None:
        site = self.site
        self.started_at = site.loop.time()
        if self.counted:
            site.inflight.enter(self)
        if self.request.timeout is not None:
            self.timer = site.loop.call_later(self.request.timeout, self.timed_out)
        pool = self.pool = site.pool
        assert pool is not None  # (a call starts only where a pool is)
        pool.acquire(self)

    # -- pool.Waiter ------------------------------------------------------------------------------

    def connected(self, conn: Outbound) -> None:
        if self.finished:
            return
        waiting, self.waiting = self.waiting, []
        core = self.up_conn = conn.core
        self.up = up = core.open_stream(self, self.headers, self.request_end and not waiting)
        for item, end in waiting:
            if isinstance(item, bytes):
                self.acknowledge(self.down, core.send_data(up, item, end), core)
            else:
                core.send_headers(up, item, end)
        self.site.flusher.flush()

    def unreachable(self, reason: str) -> None:
        self.end_unavailable(answers.UNREACHABLE_MESSAGE, Outcome.UPSTREAM_ERROR)
        self.site.flusher.flush()

    # -- streams.Handler --------------------------------------------------------------------------

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        if stream is self.down:
            up, up_conn = self.up, self.up_conn
            if up is None or up_conn is None:
                self.waiting.append((data, end))
            else:
                self.acknowledge(stream, up_conn.send_data(up, data, end), up_conn)
            return
        boundaries = self.boundaries
        if boundaries is not None:
            boundaries.follow(data)
        down_conn = self.down_conn
        self.acknowledge(stream, down_conn.send_data(self.down, data, end), down_conn)
        if boundaries is not None and boundaries.pending_not_serving and boundaries.between():
            self.not_serving()

    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        """Checked already by the connection: request trailers, the response's head or trailers."""
        if stream is self.down:
            if self.up is None or self.up_conn is None:
                self.waiting.append((headers, end))
            else:
                self.up_conn.send_headers(self.up, headers, end)
            return
        if end:
            self.status = r.grpc_status(headers)
        self.head_seen = True
        self.down_conn.send_headers(self.down, headers, end)

    def on_closed(self, stream: Stream, exit: Exit, code: int) -> None:
        if stream is self.down:
            default = Outcome.COMPLETED if exit is Exit.ENDED else Outcome.CLIENT_ABORTED
            self.finish(self.ending or default)
            return
        self.up = None
        if self.finished or exit is Exit.ENDED or exit is Exit.RESET:
            return
        if exit is Exit.PEER_RESET or exit is Exit.REFUSED:
            # One to one: REFUSED_STREAM (the model server's GOAWAY) stays REFUSED_STREAM, which a
            # gRPC client retries transparently.
            self.ending = Outcome.UPSTREAM_ERROR
            self.down_conn.reset(self.down, code)
            self.finish(Outcome.UPSTREAM_ERROR)
        elif exit is Exit.LOST:
            self.end_unavailable(answers.UPSTREAM_LOST_MESSAGE, Outcome.UPSTREAM_ERROR)
        else:
            log.warning("grpc.upstream_invalid", path=self.request.path.decode("latin-1"), error=exit.value)
            self.end_unavailable(answers.INVALID_MESSAGE, Outcome.UPSTREAM_ERROR)

    def on_sent(self, stream: Stream, n: int) -> None:
        if stream is self.up:
            self.acknowledge(self.down, n, self.up_conn)
        elif self.up is not None:
            self.acknowledge(self.up, n, self.down_conn)

    def on_end_sent(self, stream: Stream) -> None:
        if stream is self.down:
            self.finish(self.ending or Outcome.COMPLETED)

    def on_writable(self, stream: Stream) -> None:
        source, conn = (self.down, self.down_conn) if stream is self.up else (self.up, self.up_conn)
        if source is not None and conn is not None and source.owed:
            conn.grant(source, source.owed)
            source.owed = 0

    def acknowledge(self, source: Stream, n: int, target: Connection | None) -> None:
        """``n`` bytes of ``source`` went into the other side's transport: re-open ``source``'s window,
        or owe it until that transport takes its buffer (a reader that does not read)."""
        if n and target is not None:
            if target.output.paused:
                source.owed += n
            elif source is self.down:
                self.down_conn.grant(source, n)
            elif self.up_conn is not None:
                self.up_conn.grant(source, n)

    # -- endings ----------------------------------------------------------------------------------

    def end_unavailable(self, message: str, outcome: Outcome) -> None:
        """End the call for the client with ``grpc-status: 14`` (a gRPC call) or RST_STREAM CANCEL."""
        if self.finished:
            return
        self.ending = outcome
        down, conn = self.down, self.down_conn
        if self.request.grpc and conn.sending(down):
            self.status = str(GrpcStatus.UNAVAILABLE)
            conn.send_headers(down, answers.ending(GrpcStatus.UNAVAILABLE, message, head_sent=self.head_seen), True)
            return  # finish() follows when the trailers go out
        conn.reset(down, frames.CANCEL)
        self.finish(outcome)

    def abort_deadline(self) -> None:
        """The drain deadline: what waits for the client's window is dropped, the trailers go now."""
        self.down_conn.discard_pending(self.down)
        self.end_unavailable(answers.DEADLINE_MESSAGE, Outcome.DEADLINE_ABORTED)
        self.finish(Outcome.DEADLINE_ABORTED)
        self.site.flusher.flush()

    def timed_out(self) -> None:
        """The call's own ``grpc-timeout`` passed (it was passed on too; whichever end sees it first)."""
        self.timer = None
        if self.finished:
            return
        down, conn = self.down, self.down_conn
        self.ending = Outcome.COMPLETED
        self.status = str(GrpcStatus.DEADLINE_EXCEEDED)
        conn.discard_pending(down)
        ending = answers.ending(GrpcStatus.DEADLINE_EXCEEDED, answers.TIMEOUT_MESSAGE, head_sent=self.head_seen)
        conn.send_headers(down, ending, True)
        self.site.flusher.flush()

    def finish(self, outcome: Outcome) -> None:
        """Leave the in-flight count (exactly once); reset whatever of the two streams is still open."""
        if self.finished:
            return
        self.finished = True
        site = self.site
        if self.boundaries is not None:
            site.watches.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        duration = site.loop.time() - self.started_at
        if self.counted:
            site.inflight.leave(self)
            site.metrics.count_grpc(self.status or "none", outcome, duration)
            if site.access_log:
                log.info(
                    "grpc.call",
                    method=self.request.path.decode("latin-1"),
                    grpc_status=self.status,
                    outcome=outcome,
                    duration_s=round(duration, 6),
                )
        down = self.down
        if down.sid in self.down_conn.streams:  # whole (its end sent), the client still sending: it may stop (§8.1)
            self.down_conn.reset(down, frames.NO_ERROR if down.state is State.HALF_CLOSED_LOCAL else frames.CANCEL)
        up, up_conn, pool = self.up, self.up_conn, self.pool
        if pool is not None:  # (None: it never started)
            if up is None:
                pool.cancel(self)
            elif up_conn is not None and up.sid in up_conn.streams:
                up_conn.reset(up, frames.CANCEL)
            pool.released()
        ticket = self.ticket
        if ticket is not None and ticket.leave(site.loop.time() - self.started_at):
            # It waited and never started (the client reset it, or its connection went): counted
            # here, it was never in flight.
            site.metrics.count_grpc("none", outcome, 0.0)

    # -- health Watch relayed while serving ------------------------------------------------------

    def not_serving(self) -> None:
        """SIGTERM: a Watch relayed while serving gets NOT_SERVING from the router at once (at the
        next message boundary) and is no longer relayed."""
        boundaries = self.boundaries
        down, conn = self.down, self.down_conn
        if boundaries is None or self.finished or not conn.sending(down):
            return
        if not boundaries.between():
            boundaries.pending_not_serving = True
            return
        boundaries.pending_not_serving = False
        up, self.up = self.up, None
        if up is not None and self.up_conn is not None:
            self.up_conn.reset(up, frames.CANCEL)
        if not self.head_seen:
            self.head_seen = True
            conn.send_headers(down, answers.response_head(), False)
        conn.send_data(down, health.message(health.NOT_SERVING), False)
        if self.pool is not None:  # (relayed: it started)
            self.pool.released()
