"""A proxied request or WebSocket session with a span (``--tracing``): what the router does to it is
:class:`~drain_router.http1.exchange.Exchange`'s (or :class:`~drain_router.http1.handshake.Handshake`'s),
unchanged; these subclasses only watch. Without tracing they are never made, so the traffic path
pays nothing for them but the one check where a request is read (:func:`exchange_class`).

The span starts when the head is parsed, continuing the client's ``traceparent``/``tracestate``, and
the head that goes upstream carries the router's span as the parent (:func:`~.heads.traced_head`,
the client's left out by :func:`~.heads.request_head`). It ends with the request, once: the
outcome, the status the client got, the reads relayed and their bytes, the time to first byte.
Drain events on it: ``Connection: close`` sent because of the drain, the deadline abort (here), the
drain's start, a refusal at closing and the Close 1001 (where they happen, through
:func:`drain_router.tracing.event`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from drain_router import tracing
from drain_router.decisions import spans
from drain_router.http1 import answers
from drain_router.http1.classify import Admission
from drain_router.http1.exchange import Client, Destination, Exchange
from drain_router.http1.handshake import Handshake
from drain_router.http1.heads import TRACE_CONTEXT, Headers, traced_head
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.metrics import Outcome

SLOTS = ("first_byte_at", "read_bytes", "reads", "seen", "span", "tracer")
"""What a traced exchange holds beside its exchange's own."""


class Traced(Exchange):
    """What tracing adds to an exchange class, with no slots of its own: a traced class is
    ``class T(Traced, SomeExchange)`` with ``__slots__ = SLOTS`` (:class:`TracedExchange`, the
    front's), so it can extend an exchange that has slots of its own."""

    if not TYPE_CHECKING:  # (mypy would refuse the attributes its subclasses' slots hold)
        __slots__ = ()
    tracer: tracing.Tracer
    span: tracing.Span
    first_byte_at: float | None
    read_bytes: int
    reads: int
    seen: int

    def begin(self, tracer: tracing.Tracer, span: tracing.Span, attributes: spans.Attributes) -> None:
        self.tracer = tracer
        self.span = span
        span.set_attributes(attributes)
        self.first_byte_at: float | None = None
        self.read_bytes = self.reads = self.seen = 0

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        super().response_head(status, headers)
        self._closing()

    def reply(self, error: answers.Error, outcome: Outcome, *, close: bool = False, extra: bytes = b"") -> None:
        self._closing()  # (before the reply finishes it)
        super().reply(error, outcome, close=close, extra=extra)

    def _closing(self) -> None:
        """The response carries ``Connection: close`` because the router is draining (the client
        would have kept the connection)."""
        if self.keep_alive and not self.head_sent and self.client.listener.state.closes_connections:
            self.span.add_event(spans.CONNECTION_CLOSE_SENT)

    def flush(self) -> None:
        # Count what this read brought (a small body waits whole across reads: counted once).
        out = self.to_client
        if len(out) > self.seen:
            self.reads += 1
            self.read_bytes += sum(map(len, out[self.seen :]))
        head_sent = self.head_sent
        super().flush()
        self.seen = len(self.to_client)
        if not head_sent and self.head_sent and self.first_byte_at is None:
            self.first_byte_at = self.client.listener.loop.time()

    def abort_deadline(self) -> None:
        if not self.finished:
            self.span.add_event(spans.DEADLINE_ABORTED)
        super().abort_deadline()

    def finish(self, outcome: Outcome) -> None:
        if self.finished:
            return
        if self.head_sent and self.first_byte_at is None:  # a reply of the router's own
            self.first_byte_at = self.client.listener.loop.time()
        super().finish(outcome)
        code = self.code if self.head_sent else 0
        ttfb = None if self.first_byte_at is None or not self.started else self.first_byte_at - self.started_at
        attrs = spans.ending(outcome.value, chunks=self.reads, sent_bytes=self.read_bytes, ttfb=ttfb)
        if code:
            attrs["http.response.status_code"] = code
        self.tracer.end(self.span, attrs, spans.http_error(outcome.value, code))


class TracedExchange(Traced):
    __slots__ = SLOTS


class TracedHandshake(TracedExchange, Handshake):
    """A WebSocket handshake, and the session it opens, as one span (ended with the session)."""

    __slots__ = ()

    def switch(self, up: UpstreamConnection, headers: list[tuple[bytes, bytes]], rest: bytes) -> None:
        super().switch(up, headers, rest)
        self.first_byte_at = self.client.listener.loop.time()
        tunnel = self.client.tunnel
        if tunnel is not None:
            tunnel.span = self.span  # its Close 1001 is an event on this span


def exchange(
    tracer: tracing.Tracer,
    client: Client,
    dest: Destination,
    method: bytes,
    target: bytes,
    version: str,
    keep_alive: bool,
    verdict: Admission,
    headers: Headers,
) -> Exchange:
    """The exchange of a request read with tracing on (``headers``: as parsed): its span started
    from the client's trace context, the head that goes upstream given the router's span as its
    parent. A request sampled out is a plain :class:`Exchange` (or :class:`Handshake`): its span
    records nothing, so nothing needs watching."""
    parent: list[str] = []
    state: list[str] = []
    host = None
    for name, value in headers:
        lower = name.lower()
        if lower in TRACE_CONTEXT:
            (parent if lower == b"traceparent" else state).append(value.decode("latin-1"))
        elif lower == b"host" and host is None:
            host = value.decode("latin-1")
    verb = method.decode("latin-1")
    span, traceparent, tracestate = tracer.server(verb, parent, state)
    request, problem, key, http10 = verdict.request, verdict.problem, verdict.ws_key, version == "1.0"
    if request is not None and problem is None:
        request.head = traced_head(request.head, traceparent, tracestate)
    if not span.is_recording():
        if key is None or request is None:
            return dest.exchange_type(client, dest, method, target, http10, keep_alive, request, problem)
        return Handshake(client, dest, method, target, http10, keep_alive, request, key)
    made: Traced
    if key is None or request is None:
        made = cast(
            Traced, dest.traced_exchange_type(client, dest, method, target, http10, keep_alive, request, problem)
        )
    else:
        made = TracedHandshake(client, dest, method, target, http10, keep_alive, request, key)
    peer = client.peer.decode("latin-1")
    attrs = spans.http_start(
        verb,
        target.decode("latin-1"),
        version,
        host,
        peer,
        port=80,
        websocket=key is not None,
        keep_query=tracer.keep_query,
    )
    made.begin(tracer, span, attrs)
    return made
