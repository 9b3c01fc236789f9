"""A gRPC call and the admission gate (:mod:`drain_router.admission.gate`), when
``--max-concurrent-requests`` is set: the same slots and queue as the HTTP/1.1 listener's.

A counted call (health calls never are) takes a slot when it starts (:func:`admit`), or waits in
the queue as a :class:`Ticket`: not counted while it waits (what the client sends meanwhile waits
in the call, held by flow control), given a slot it starts at once; refused, it ends with a
trailers-only response, ``grpc-status`` 8 (RESOURCE_EXHAUSTED: queue full, or waited past
``--queue-timeout-secs``) or 14 (UNAVAILABLE: the router is closing), with
``grpc-retry-pushback-ms``, and never reaches the model server. A client's RST_STREAM while it
waits frees its place at once (:func:`leave`)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drain_router import tracing
from drain_router.admission.gate import Gate
from drain_router.decisions import capacity, spans
from drain_router.decisions.capacity import Reason
from drain_router.decisions.grpc_status import GrpcStatus
from drain_router.grpc import answers
from drain_router.grpc.connection import Flusher
from drain_router.h2 import frames
from drain_router.h2 import rules as r
from drain_router.h2.connection import Connection
from drain_router.h2.streams import Stream
from drain_router.metrics import Metrics, Outcome

#: ``Call.gated`` while it holds a slot (a :class:`Ticket` while it waits, None: not gated).
HOLDING = "holding"
PUSHBACK = b"grpc-retry-pushback-ms"


class Site(Protocol):
    """What the gate's side of a call needs from its listener."""

    metrics: Metrics
    flusher: Flusher
    loop: asyncio.AbstractEventLoop
    answers: dict[Reason, tuple[GrpcStatus, str]]
    """The status and message of each refusal (the router's :data:`~drain_router.decisions.capacity.GRPC_ANSWERS`)."""

    @property
    def gate(self) -> Gate | None: ...


class Gated(Protocol):
    """A call, as the gate acts on it."""

    gated: Any
    counted: bool
    status: str | None
    ending: Outcome | None
    started_at: float

    @property
    def site(self) -> Site: ...
    @property
    def down(self) -> Stream: ...
    @property
    def down_conn(self) -> Connection: ...
    @property
    def request(self) -> r.Request: ...

    def start(self) -> None: ...
    def finish(self, outcome: Outcome) -> None: ...


class Ticket:
    """A waiting call's place in the gate's queue (the gate's :class:`~drain_router.admission.gate.Waiter`)."""

    __slots__ = ("call",)

    def __init__(self, call: Gated) -> None:
        self.call = call

    def granted(self) -> None:
        call = self.call
        call.gated = HOLDING
        call.counted = True
        call.start()

    def refused(self, reason: Reason, retry_after: float) -> None:
        call = self.call
        call.gated = None
        refuse(call, reason, retry_after)


def admit(call: Gated, gate: Gate) -> bool:
    """A new call: True when it starts now (a slot); False when it waits for one or was refused."""
    if gate.take():
        call.gated = HOLDING
        return True
    call.counted = False  # not in flight while it waits
    ticket = Ticket(call)
    if gate.wait(ticket):
        call.gated = ticket
    return False


def leave(call: Gated, outcome: Outcome) -> None:
    """The call ended: its slot goes back (to the oldest waiter, if any), or its place in the queue
    is freed (the client reset it, or its connection went: counted here, it was never in flight)."""
    gate = call.site.gate
    assert gate is not None  # (it was gated)
    gated, call.gated = call.gated, None
    if gated is HOLDING:
        gate.release(call.site.loop.time() - call.started_at)
    elif gated is not None:
        gate.withdraw(gated)
        call.site.metrics.count_grpc("none", outcome, 0.0)


def refuse(call: Gated, reason: Reason, retry_after: float) -> None:
    """Trailers-only: RESOURCE_EXHAUSTED or UNAVAILABLE, with when to retry; counted ``rejected``."""
    status, message = call.site.answers[reason]
    if reason is Reason.CLOSING:
        tracing.event(call, spans.REFUSED_CLOSING)
    answer(call, status, message, capacity.headers(retry_after)[1])


def answer(call: Gated, status: int, message: str, pushback_ms: int | None = None) -> None:
    """The call ends before it reached any model server: trailers-only with ``status`` and
    ``message`` (and ``grpc-retry-pushback-ms`` when given), or REFUSED_STREAM for an h2c stream
    that is not a gRPC call; counted ``rejected``, never in flight."""
    call.counted = False  # never in flight: counted here
    call.status = str(status)
    call.site.metrics.count_grpc(call.status, Outcome.REJECTED, 0.0)
    call.ending = Outcome.REJECTED
    down, conn = call.down, call.down_conn
    if call.request.grpc and conn.sending(down):
        ending = answers.ending(status, message, head_sent=False)
        if pushback_ms is not None:
            ending.append((PUSHBACK, b"%d" % pushback_ms))
        conn.send_headers(down, ending, True)
    else:  # not a gRPC call (an h2c stream): refused as a stream, which a client may retry
        conn.reset(down, frames.REFUSED_STREAM)
        call.finish(Outcome.REJECTED)
    call.site.flusher.flush()
