"""The OpenTelemetry SDK, set up the standard way: a ``TracerProvider`` whose sampler, resource and
exporter come from the ``OTEL_*`` environment variables (``OTEL_TRACES_SAMPLER`` and its ``_ARG``,
``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``OTEL_BSP_*``, ...), read by the SDK
itself; W3C trace context through the SDK's own propagator; spans exported over OTLP/HTTP by the
SDK's ``BatchSpanProcessor``, in its own thread, from a bounded queue.

Export never blocks the traffic path: ending a span puts it on the queue (or drops it when the queue
is full); a collector that is slow or down only fills the queue. :class:`CountingProcessor` counts
what the batch processor drops. The only module that imports OpenTelemetry (imported by
:func:`drain_router.tracing.start` only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.environment_variables import OTEL_BSP_MAX_QUEUE_SIZE
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from drain_router.decisions import sampling as fast
from drain_router.decisions.spans import Attributes

#: The SDK's default ``OTEL_BSP_MAX_QUEUE_SIZE``.
DEFAULT_QUEUE_SIZE = 2048
#: How long an exit waits for the queued spans to be exported (a collector that is down must not
#: hold a pod's termination).
EXPORT_AT_EXIT_SECS = 2.0

_PROPAGATOR = TraceContextTextMapPropagator()
_SERVER = SpanKind.SERVER

# The batch processor logs a warning for every span it drops when its queue is full: on the loop
# thread, at the moment a slow collector makes things worst. The drops are counted
# (drain_router_tracing_spans_dropped_total); its other warnings and errors still show.
logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)


def queue_size() -> int:
    """``OTEL_BSP_MAX_QUEUE_SIZE`` as the batch processor reads it (its default when unset or not a
    positive integer)."""
    try:
        size = int(os.environ.get(OTEL_BSP_MAX_QUEUE_SIZE, DEFAULT_QUEUE_SIZE))
    except ValueError:
        return DEFAULT_QUEUE_SIZE
    return size if size > 0 else DEFAULT_QUEUE_SIZE


class _Taken(SpanExporter):
    """The exporter, counting the spans the batch processor's thread took off its queue."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.taken = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)  # the export thread is the only writer
        return self.exporter.export(spans)

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class CountingProcessor(SpanProcessor):
    """The SDK's ``BatchSpanProcessor`` (configured by ``OTEL_BSP_*``), wrapped to count the spans it
    drops. Its queue holds the sampled spans ended and not yet taken by the export thread; one ended
    while it holds ``OTEL_BSP_MAX_QUEUE_SIZE`` makes the processor drop its oldest: counted here by
    ``on_drop``. (Only the loop thread ends spans; the export thread only takes them.)"""

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[int], None]) -> None:
        self.exporter = _Taken(exporter)
        self.batch = BatchSpanProcessor(self.exporter)
        self.capacity = queue_size()
        self.queued = 0
        """Spans put on the queue that stay there (a drop replaces one)."""
        self.on_drop = on_drop

    def on_start(self, span: trace.Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        if self.queued - self.exporter.taken >= self.capacity:
            self.on_drop(1)
        else:
            self.queued += 1
        self.batch.on_end(span)

    def shutdown(self) -> None:
        self.batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.batch.force_flush(timeout_millis)


def plan_of(sampler: sampling.Sampler) -> fast.Plan | None:
    """The SDK's sampler (built from ``OTEL_TRACES_SAMPLER``) as a :class:`~drain_router.decisions.sampling.Plan`, for the
    kinds that environment variable names; None for any other (every span then asks the SDK)."""

    def root(of: object) -> int | None:
        if of is sampling.ALWAYS_ON:
            return fast.ALWAYS
        if of is sampling.ALWAYS_OFF:
            return 0
        return of.bound if type(of) is sampling.TraceIdRatioBased else None

    if type(sampler) in (sampling.ParentBased, sampling.ParentBasedTraceIdRatio):
        # The delegates' attributes are the SDK's own; a ParentBased built otherwise than the
        # environment builds it (other delegates) takes the SDK's path.
        delegates = (
            getattr(sampler, "_remote_parent_sampled", None),
            getattr(sampler, "_remote_parent_not_sampled", None),
        )
        bound = root(getattr(sampler, "_root", None))
        if delegates != (sampling.ALWAYS_ON, sampling.ALWAYS_OFF) or bound is None:
            return None
        return fast.Plan(parent_based=True, bound=bound)
    bound = root(sampler)
    return None if bound is None else fast.Plan(parent_based=False, bound=bound)


class _Ids(RandomIdGenerator):
    """The SDK's random ids, but a root trace id drawn by :func:`~drain_router.decisions.sampling.decide` is the one its span
    gets (its sampler then decides on the same id)."""

    def __init__(self) -> None:
        self.drawn = 0

    def generate_trace_id(self) -> int:
        drawn, self.drawn = self.drawn, 0
        return drawn or super().generate_trace_id()


class _SampledOut:
    """A span sampled out before the SDK was asked: records nothing (its callers check first)."""

    __slots__ = ()

    def is_recording(self) -> bool:
        return False

    def add_event(self, name: str) -> None:
        pass

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        pass

    def set_attributes(self, attributes: Attributes) -> None:
        pass

    def end(self) -> None:
        pass


SAMPLED_OUT = _SampledOut()


class Tracing:
    """The router's (or controller's) tracer: see :class:`drain_router.tracing.Tracer`."""

    def __init__(
        self,
        service: str,
        on_drop: Callable[[int], None],
        exporter: SpanExporter | None = None,
        *,
        keep_query: bool = False,
    ) -> None:
        self.keep_query = keep_query
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service}))
        # The sampler is the SDK's from OTEL_TRACES_SAMPLER (default parentbased_always_on). No
        # atexit hook: shutdown() bounds the wait.
        self.ids = _Ids()
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False, id_generator=self.ids)
        self.plan = plan_of(self.provider.sampler)
        self.processor = CountingProcessor(exporter or OTLPSpanExporter(), on_drop)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("drain_router")

    def server(
        self, name: str, traceparent: list[str], tracestate: list[str]
    ) -> tuple[trace.Span | _SampledOut, bytes, bytes | None]:
        plan = self.plan
        if plan is not None:
            drawn = random.getrandbits(128) or 1
            verdict = fast.decide(plan, traceparent, tracestate, drawn)
            if verdict is not None:
                if not verdict[0]:
                    return SAMPLED_OUT, fast.upstream_traceparent(verdict, random.getrandbits(64) or 1), None
                if not traceparent:
                    self.ids.drawn = drawn  # the root span the SDK starts gets the id decided on
        parent = None
        if traceparent:  # the client's context, parsed (and validated) by the SDK's W3C propagator
            carrier = (
                {"traceparent": traceparent, "tracestate": tracestate} if tracestate else {"traceparent": traceparent}
            )
            parent = _PROPAGATOR.extract(carrier)
        span = self.tracer.start_span(name, parent, _SERVER)
        # The upstream's traceparent, written as the propagator's inject writes it (version 00), from
        # the span's context directly: inject's carrier and context objects cost 1.5 µs a request.
        context = span.get_span_context()
        out = b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)
        state = context.trace_state
        return span, out, state.to_header().encode("latin-1") if state else None

    def end(self, span: Any, attributes: Attributes, error: str | None) -> None:
        """``span``: one :meth:`server` started (typed by its use where it is held)."""
        if span.is_recording():
            span.set_attributes(attributes)
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    @contextlib.contextmanager
    def internal(self, name: str, attributes: Attributes) -> Iterator[trace.Span]:
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def shutdown(self) -> None:
        # The provider's shutdown waits for the export thread, up to 30 s with a collector down:
        # run it aside and wait at most EXPORT_AT_EXIT_SECS (the thread is a daemon).
        flushing = threading.Thread(target=self.provider.shutdown, name="drain-router-trace-flush", daemon=True)
        flushing.start()
        flushing.join(EXPORT_AT_EXIT_SECS)
