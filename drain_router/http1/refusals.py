"""Connections a listener refuses past its connection cap, for both listeners (traffic and admin).

Each is answered a fixed 503 without being parsed, counted in ``connections_refused_total`` under
the listener's reason, logged at most once per interval, and closed once its request was read
(closing with it unread would reset the connection and lose the answer) or after
:data:`REFUSED_LINGER_SECS`; when ``max_lingering`` already linger, it is closed at once, so that
refusals themselves hold a bounded number of descriptors.
"""

from __future__ import annotations

import asyncio
from typing import Any

from drain_router import lingering, logs
from drain_router.metrics import Metrics

#: How long a refused connection may stay open for its request to be read before it is closed.
REFUSED_LINGER_SECS = 1.0


class Refusals:
    """One listener's refusals: the answer, the count, the log line, the lingering ones."""

    def __init__(
        self, metrics: Metrics, logger: Any, *, event: str, reason: str, answer: bytes, max_lingering: int
    ) -> None:
        self.counter = metrics.connections_refused.labels(reason)
        self.answer = answer
        self.max_lingering = max_lingering
        self.lingering = 0
        self.log = logs.RateLimited(logger, event, level="warning")

    def protocol(self, *, open_connections: int, limit: int) -> asyncio.Protocol:
        """The protocol for a connection accepted past ``limit``."""
        self.refused(open_connections=open_connections, limit=limit)
        return RefusedConnection(self)

    def refused(self, *, open_connections: int, limit: int) -> None:
        """Count and log (rate-limited) one refusal, whoever answers it."""
        self.counter.inc()
        self.log.emit(open_connections=open_connections, limit=limit)


class RefusedConnection(asyncio.Protocol):
    """A connection past the cap: answered, then closed once its request was read or after a second."""

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        refusals = self.refusals
        transport.write(refusals.answer)
        if refusals.lingering >= refusals.max_lingering:
            transport.close()
            return
        if lingering.linger(transport, REFUSED_LINGER_SECS):
            refusals.lingering += 1
            self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.transport is not None:
            self.transport = None
            self.refusals.lingering -= 1
