"""How a realtime (WebSocket) session ended: pure functions over what a realtime client saw.

No I/O here: the counterpart of :mod:`drain_router_dev.streams` for ``/v1/realtime`` sessions. A client
(:mod:`drain_router_dev.realtime`) records a :class:`SessionResult` (the handshake's status, the Close
code, who closed first, whether the events arrived whole, checked by a :class:`Tally`) and
:func:`classify` names the end. Clean ends are a Close 1000 (Normal Closure) and a Close 1001
(Going Away: a server or proxy going down, the client reconnects); a 1006 (Abnormal Closure: the
connection was lost without a Close frame, a reset or a cut tunnel) is a loss, and so is a handshake
that failed or events that arrived out of order.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

NORMAL_CLOSURE = 1000
GOING_AWAY = 1001
ABNORMAL_CLOSURE = 1006
"""Never sent on the wire (RFC 6455 §7.4.1): what a client library reports for a connection lost
without a Close frame."""
SWITCHING_PROTOCOLS = 101


class End(str, enum.Enum):
    NORMAL = "normal"
    """A Close 1000 (either side first), the closing handshake done."""
    GOING_AWAY = "going_away"
    """A Close 1001: the server side is going down; the client reconnects, on purpose."""
    ABNORMAL = "abnormal"
    """The connection was lost without a Close (1006): a reset, a cut tunnel, a crashed server."""
    OTHER_CLOSE = "other_close"
    """A Close with another code (1011 internal error, 1002 protocol error, ...)."""
    REFUSED = "refused"
    """No handshake answer at all: refused, reset or timed out before a status line."""
    REJECTED = "rejected"
    """The handshake was answered with a status other than 101 (a balancer's 503, a router's 501)."""
    BAD_EVENTS = "bad_events"
    """Events missing, repeated, out of order, unreadable, or an ``error`` event from the server."""

    @property
    def clean(self) -> bool:
        """Ended with a Close 1000 or 1001: what a drain must leave behind."""
        return self in (End.NORMAL, End.GOING_AWAY)

    @property
    def reconnect(self) -> bool:
        """The client should open a new session (through the balancer, to another replica)."""
        return self is End.GOING_AWAY


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionResult:
    handshake_status: int | None
    """The handshake's HTTP status (101 when the session opened), ``None`` when no answer came."""
    close_code: int | None = None
    """The Close code the client library reports at the end: the code of the Close it received
    (the peer's reply when the client closed first), 1006 for a connection lost without one. The
    code alone decides the end, whichever side closed first."""
    client_closed: bool = False
    """The client sent the first Close (it was done), rather than the server side."""
    error: str | None = None
    """The transport error the client hit, if any."""
    problem: str | None = None
    """What :class:`Tally` found wrong with the events, if anything."""


def classify(result: SessionResult) -> End:
    """How one session ended. Purely computational."""
    if result.handshake_status is None:
        return End.REFUSED
    if result.handshake_status != SWITCHING_PROTOCOLS:
        return End.REJECTED
    if result.problem is not None:
        return End.BAD_EVENTS
    code = result.close_code
    if code is None or code == ABNORMAL_CLOSURE:
        return End.ABNORMAL
    if code == NORMAL_CLOSURE:
        return End.NORMAL
    if code == GOING_AWAY:
        return End.GOING_AWAY
    return End.OTHER_CLOSE


class Tally:
    """Checks a session's server events as they arrive: ``session.created`` first, then per
    response ``response.created``, ``response.text.delta`` numbered 0, 1, ... (``seq``, with one
    ``total``), ``response.done`` after exactly ``total`` deltas. A response cut by the session's
    end is not a problem (the session's Close says why it ended). Purely computational."""

    def __init__(self) -> None:
        self.server: Any = None
        """``session.created``'s ``server`` (the fake model's pid): which replica held the session."""
        self.responses = 0
        """Responses received whole (``response.done``)."""
        self.deltas = 0
        self.problem: str | None = None
        self._created = False
        self._in_response = False
        self._next_seq = 0
        self._total: int | None = None

    @property
    def responding(self) -> bool:
        return self._in_response

    def _fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if not self._created:
            if kind != "session.created":
                self._fail(f"first event {kind!r}, not session.created")
                return
            self._created, self.server = True, event.get("server")
        elif kind == "session.created":
            self._fail("a second session.created")
        elif kind == "response.created":
            if self._in_response:
                self._fail("response.created inside a response")
            self._in_response, self._next_seq, self._total = True, 0, None
        elif kind == "response.text.delta":
            self._delta(event)
        elif kind == "response.done":
            if not self._in_response:
                self._fail("response.done outside a response")
            elif self._next_seq != (self._total or 0):
                self._fail(f"response.done after {self._next_seq} of {self._total} deltas")
            self._in_response = False
            self.responses += 1
        elif kind == "error":
            error = event.get("error")
            self._fail(f"error event: {error.get('code') if isinstance(error, dict) else error}")
        else:
            self._fail(f"unexpected event {kind!r}")

    def _delta(self, event: Mapping[str, Any]) -> None:
        seq, total = event.get("seq"), event.get("total")
        if not self._in_response:
            self._fail("a delta outside a response")
        elif not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(total, int):
            self._fail("a delta without an integer seq and total")
        elif seq != self._next_seq:
            self._fail(f"delta {seq} where {self._next_seq} was due")
        elif self._total is not None and total != self._total:
            self._fail(f"total changed from {self._total} to {total}")
        elif seq >= total:
            self._fail(f"delta {seq} of {total}")
        else:
            self._next_seq, self._total = seq + 1, total
            self.deltas += 1
