"""One request's place at the gate (:mod:`.gate`): the same for an HTTP/1.1 exchange, a WebSocket
handshake and a gRPC call.

In its turn a request takes a slot (:meth:`Ticket.admit`) or waits in the gate's queue; given a slot
while it waited, it starts at once (:meth:`Admitted.admitted`); refused (queue full, waited past
``--queue-timeout-secs``, closing), it gets the router's own answer with when to retry
(:meth:`Admitted.refused`) and never reaches the model server; the activator may end a waiting one
with an answer of its own (:meth:`Ticket.answer`). As it ends it gives its slot back,
or its place in the queue (:meth:`Ticket.leave`), before it leaves the in-flight count, so the next
one enters before the count can read zero.
"""

from __future__ import annotations

from typing import Any, Protocol

from drain_router.admission.gate import Gate
from drain_router.decisions.capacity import Answer, Reason

#: :attr:`Ticket.state`: neither a slot nor a place (not yet admitted, refused, or given back).
OUT = 0
#: It waits in the gate's queue.
WAITING = 1
#: It holds a slot.
HOLDING = 2


class Admitted(Protocol):
    """A request as its ticket acts on it (an exchange or a call)."""

    def admitted(self) -> None:
        """It was given a slot after waiting: it enters the in-flight count and goes on now."""

    @property
    def speaks_grpc(self) -> bool:
        """A gRPC call (its answers are :attr:`Answer.grpc`), else an HTTP/1.1 request."""

    def refused(self, reason: Reason, retry_after: float) -> None:
        """It never gets a slot: the router answers it, ``retry_after`` seconds estimated."""

    def answer(self, words: Any) -> None:
        """It ends now with the router's own answer (:class:`Answer`'s words in its protocol)."""


class Ticket:
    """The gate's waiter for one request: a slot it holds, or its place in the queue."""

    __slots__ = ("gate", "request", "state")

    def __init__(self, gate: Gate, request: Admitted) -> None:
        self.gate = gate
        self.request = request
        self.state = OUT

    def admit(self) -> bool:
        """Its turn: True when it holds a slot now; False when it waits for one, or was refused at
        once (answered already)."""
        gate = self.gate
        if gate.take():
            self.state = HOLDING
            return True
        if gate.wait(self):
            self.state = WAITING
        return False

    def leave(self, held: float) -> bool:
        """It ended: a slot held ``held`` seconds goes back (to the oldest waiter, if any), or its
        place in the queue is freed. True when it was still waiting (it never started)."""
        state, self.state = self.state, OUT
        if state == HOLDING:
            self.gate.release(held)
        elif state == WAITING:
            self.gate.withdraw(self)
            return True
        return False

    # -- the gate's Waiter -------------------------------------------------------------------------

    def granted(self) -> None:
        self.state = HOLDING
        self.request.admitted()

    def refused(self, reason: Reason, retry_after: float) -> None:
        self.state = OUT
        self.request.refused(reason, retry_after)

    def answer(self, answer: Answer) -> bool:
        """While it waits, the caller ends it with ``answer`` (the activator's: no such service, no
        gRPC port): True when answered; False when ``answer`` has no words for its protocol (it
        goes on waiting)."""
        words = answer.grpc if self.request.speaks_grpc else answer.http
        if words is None or self.state != WAITING:
            return False
        self.state = OUT
        self.gate.withdraw(self)
        self.request.answer(words)
        return True
