"""An exchange (a proxied HTTP/1.1 request or a WebSocket handshake, then its tunnel) and the
admission gate (:mod:`drain_router.admission.gate`), when ``--max-concurrent-requests`` is set.

In its turn an exchange takes a slot and is sent (:func:`admit`), or waits in the gate's queue as a
:class:`Ticket`: given a slot, it enters the in-flight count at once and is sent in the next turn of
the loop; refused, it gets the router's 429 or 503 with ``Retry-After`` and ``retry-after-ms`` and
never reaches the model server. A request the router refuses anyway (a bad head) and a ``GET`` of
an exempt path (:func:`~drain_router.decisions.capacity.exempt`) never take a slot. It gives its
slot back, or its place in the queue, as it ends (:func:`leave`), before it leaves the in-flight
count, so the next one enters before the count can read zero.
"""

from __future__ import annotations

from typing import Any, Protocol

from drain_router import tracing
from drain_router.admission.gate import Gate
from drain_router.decisions import capacity, spans
from drain_router.decisions.capacity import Reason
from drain_router.http1 import answers, forwarding, relaying
from drain_router.metrics import Outcome

#: ``Exchange.gated`` while it holds a slot (a :class:`Ticket` while it waits, None: not gated).
HOLDING = "holding"


class Gated(relaying.Relayed, Protocol):
    """The exchange, as the gate acts on it."""

    gated: Any
    """None, :data:`HOLDING`, or its :class:`Ticket` while it waits."""
    started: bool
    started_at: float

    def abort_deadline(self) -> None: ...


class Ticket:
    """A waiting exchange's place in the gate's queue (the gate's :class:`~drain_router.admission.gate.Waiter`)."""

    __slots__ = ("exchange",)

    def __init__(self, exchange: Gated) -> None:
        self.exchange = exchange

    def granted(self) -> None:
        exchange = self.exchange
        exchange.gated = HOLDING
        listener = exchange.client.listener
        exchange.started = True
        exchange.started_at = listener.loop.time()
        listener.inflight.enter(exchange)
        listener.loop.call_soon(_send, exchange)

    def refused(self, reason: Reason, retry_after: float) -> None:
        exchange = self.exchange
        exchange.gated = None
        refuse(exchange, reason, retry_after)


def _send(exchange: Gated) -> None:
    if not exchange.finished:
        forwarding.send(exchange)


def admit(exchange: Gated, gate: Gate) -> bool:
    """Its turn has come: True when it goes on now (a slot, or none needed); False when it waits
    for one or was refused."""
    if exchange.request is None or exchange.problem is not None:
        return True  # refused in its turn by the router anyway
    if capacity.exempt(exchange.method, exchange.target.partition(b"?")[0], exchange.client.listener.exempt_paths):
        return True
    if gate.take():
        exchange.gated = HOLDING
        return True
    ticket = Ticket(exchange)
    if gate.wait(ticket):
        exchange.gated = ticket
    return False


def leave(exchange: Gated) -> None:
    """It ended: its slot goes back (to the oldest waiter, if any), or its place in the queue is freed."""
    gate = exchange.dest.gate
    assert gate is not None  # (it was gated)
    gated, exchange.gated = exchange.gated, None
    if gated is HOLDING:
        gate.release(exchange.client.listener.loop.time() - exchange.started_at)
    elif gated is not None:
        gate.withdraw(gated)


def refuse(exchange: Gated, reason: Reason, retry_after: float) -> None:
    """The router's own answer: 429 or 503 (at closing with ``Connection: close``), with when to retry."""
    status, kind, message, close = capacity.HTTP_ANSWERS[reason]
    exchange.discard = True
    if reason is Reason.CLOSING:
        tracing.event(exchange, spans.REFUSED_CLOSING)
    extra = answers.retry_after(*capacity.headers(retry_after))
    relaying.reply(exchange, (status, kind, message), Outcome.REJECTED, close, extra)
