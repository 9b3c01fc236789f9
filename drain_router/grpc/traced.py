"""A gRPC call with a span (``--tracing``): what the router does to it is
:class:`~drain_router.grpc.call.Call`'s, unchanged; :class:`TracedCall` only watches. Without
tracing it is never made (health calls never have one either).

The span starts with the client's HEADERS, continuing its ``traceparent``/``tracestate``, and the
HEADERS that go upstream carry the router's span as the parent (:func:`~drain_router.h2.rules.traced`). It ends
with the call: the outcome, ``rpc.grpc.status_code``, the DATA frames relayed from the model server
and their bytes, the time to its first HEADERS. Drain events on it: the deadline (here), the drain's
start, the GOAWAY and a refusal at closing (where they happen, through
:func:`drain_router.tracing.event`).
"""

from __future__ import annotations

from drain_router import tracing
from drain_router.decisions import spans
from drain_router.grpc.call import Call, Site
from drain_router.h2 import rules as r
from drain_router.h2.connection import Connection
from drain_router.h2.streams import Headers, Stream
from drain_router.metrics import Outcome


class TracedCall(Call):
    __slots__ = ("first_byte_at", "read_bytes", "reads", "span", "tracer")

    def begin(self, tracer: tracing.Tracer, span: tracing.Span, attributes: spans.Attributes) -> None:
        self.tracer = tracer
        self.span = span
        span.set_attributes(attributes)
        self.first_byte_at: float | None = None
        self.read_bytes = self.reads = 0

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        if stream is not self.down:
            self.reads += 1
            self.read_bytes += len(data)
        super().on_data(stream, data, end)

    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        if stream is not self.down and self.first_byte_at is None:
            self.first_byte_at = self.site.loop.time()
        super().on_headers(stream, headers, end)

    def abort_deadline(self) -> None:
        if not self.finished:
            self.span.add_event(spans.DEADLINE_ABORTED)
        super().abort_deadline()

    def finish(self, outcome: Outcome) -> None:
        if self.finished:
            return
        super().finish(outcome)
        status = int(self.status) if self.status is not None and self.status.isdigit() else None
        started = self.started_at
        ttfb = None if self.first_byte_at is None or not started else self.first_byte_at - started
        attrs = spans.ending(outcome.value, chunks=self.reads, sent_bytes=self.read_bytes, ttfb=ttfb)
        if status is not None:
            attrs["rpc.grpc.status_code"] = status
        self.tracer.end(self.span, attrs, spans.grpc_error(outcome.value, status))


def call(
    tracer: tracing.Tracer,
    site: Site,
    conn: Connection,
    stream: Stream,
    headers: Headers,
    request: r.Request,
    end: bool,
) -> Call:
    """A counted call with tracing on: its span started from the client's trace context, the HEADERS
    that go upstream given the router's span as their parent. A call sampled out is a plain
    :class:`Call`."""
    parent: list[str] = []
    state: list[str] = []
    authority = None
    for field, value in headers:
        if field == b"traceparent":
            parent.append(value.decode("latin-1"))
        elif field == b"tracestate":
            state.append(value.decode("latin-1"))
        elif field == b":authority":
            authority = value.decode("latin-1")
    name, attrs = spans.grpc_start(request.path.decode("latin-1"), authority, port=80, keep_query=tracer.keep_query)
    span, traceparent, tracestate = tracer.server(name, parent, state)
    headers = r.traced(headers, traceparent, tracestate)
    if not span.is_recording():
        return Call(site, conn, stream, headers, request, end, counted=True)
    made = TracedCall(site, conn, stream, headers, request, end, counted=True)
    made.begin(tracer, span, attrs)
    return made
