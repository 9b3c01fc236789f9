"""Every metric the router exports, in one place. Names are part of the contract (docs/metrics.md).

``Metrics(registry)`` takes a :class:`prometheus_client.CollectorRegistry` so tests build a fresh one.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string

PREFIX = "drain_router_"

# prometheus_client leaves its exposition helper unannotated: typed once, here.
float_to_go_string = cast(Callable[[float], str], _float_to_go_string)


class Outcome(enum.StrEnum):
    """How a proxied request (or WebSocket session) ended: the ``outcome`` label of ``requests_total``.
    The side that failed is named: never ``upstream_error`` for a client's mistake."""

    COMPLETED = "completed"
    CLIENT_ABORTED = "client_aborted"
    UPSTREAM_ERROR = "upstream_error"
    DEADLINE_ABORTED = "deadline_aborted"
    REJECTED = "rejected"


DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: The ``reason`` label of ``admission_rejections_total`` (drain_router.decisions.capacity.Reason).
ADMISSION_REASONS = ("queue_full", "queue_timeout", "closing")
TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class HotHistogram:
    """A histogram for the hot path: no lock, no per-sample object. The event loop is its only writer
    and its only reader (``/metrics`` is served on the same loop), so a lock would buy nothing; this
    saves microseconds per request against ``prometheus_client.Histogram`` and exports the same family."""

    __slots__ = ("bounds", "counts", "doc", "name", "total")

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.doc = doc
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self) -> HistogramMetricFamily:
        buckets = []
        running = 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            running += count
            buckets.append((float_to_go_string(bound), running))
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.total)


class _HotPath(Collector):
    """Exports the hot-path families at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        requests = CounterMetricFamily(PREFIX + "requests", m.REQUESTS_DOC, labels=["code", "outcome"])
        for (code, outcome), count in sorted(m.request_counts.items()):
            requests.add_metric([str(code), outcome.value], count)
        yield requests
        yield m.duration.family()
        yield m.ttfb.family()


class Metrics:
    """The router's Prometheus metrics."""

    REQUESTS_DOC = "Proxied requests by status code and outcome."

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.inflight = Gauge(
            PREFIX + "inflight_requests",
            "Proxied requests between headers parsed and last byte written (probes and admin excluded).",
            registry=registry,
        )
        self.request_counts: dict[tuple[int, Outcome], int] = {}
        """Proxied requests by (status code, outcome): ``requests_total``."""
        self.duration = HotHistogram(
            PREFIX + "request_duration_seconds",
            "Proxied request duration, headers parsed to last byte written.",
            DURATION_BUCKETS,
        )
        self.ttfb = HotHistogram(
            PREFIX + "time_to_first_byte_seconds",
            "Headers parsed to response headers sent to the client.",
            TTFB_BUCKETS,
        )
        registry.register(_HotPath(self))
        self.state = Gauge(PREFIX + "state", "1 for the router's current drain state.", ["state"], registry=registry)
        self.upstream_up = Gauge(
            PREFIX + "upstream_up",
            "1 when the model server answered its last health check (or last connect), else 0.",
            registry=registry,
        )
        self.advisory = Gauge(
            PREFIX + "advisory", "1 for each startup advisory that applies.", ["code"], registry=registry
        )
        self.shutdown_drain_seconds = Gauge(
            PREFIX + "shutdown_drain_seconds", "Configured --shutdown-drain-secs.", registry=registry
        )
        self.termination_grace_seconds = Gauge(
            PREFIX + "termination_grace_seconds",
            "Declared --termination-grace-secs (absent when not declared).",
            registry=registry,
        )
        self.drain_deadline = Gauge(
            PREFIX + "drain_deadline_timestamp_seconds",
            "Unix time of the in-flight deadline (t0 + grace - 2 s) once a drain with a declared "
            "--termination-grace-secs started; 0 before. What is still in flight then is aborted.",
            registry=registry,
        )
        self.connections_refused = Counter(
            PREFIX + "connections_refused",
            "Client connections closed unserved: reason connection_limit (the traffic listener's cap, "
            "keeping the descriptor reserve), header_timeout (a request head too slow) or "
            "admin_connection_limit (the admin listener's cap, its own share of the reserve) or "
            "grpc_connection_limit (the gRPC listener's share).",
            ["reason"],
            registry=registry,
        )
        self.websocket_sessions = Gauge(
            PREFIX + "websocket_sessions",
            "Open WebSocket tunnels (each is also one of inflight_requests).",
            registry=registry,
        )
        self.grpc_requests = Counter(
            PREFIX + "grpc_requests",
            "Streams of the gRPC listener, by the grpc-status the client got (none: ended by a reset "
            "or refused) and outcome (as requests_total's); each is also one of inflight_requests. "
            "Health calls are not counted.",
            ["grpc_status", "outcome"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            PREFIX + "queue_depth",
            "Requests waiting for an admission slot (--max-concurrent-requests); not in inflight_requests.",
            registry=registry,
        )
        self.queue_wait = Histogram(
            PREFIX + "queue_wait_seconds",
            "Time a request waited in the admission queue, however the wait ended (a slot, a refusal, "
            "the client leaving); requests that found a free slot do not wait and are not observed.",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.admission_rejections = Counter(
            PREFIX + "admission_rejections",
            "Requests refused by admission control, never sent to the model server: queue_full (429, "
            "gRPC RESOURCE_EXHAUSTED), queue_timeout (503, gRPC RESOURCE_EXHAUSTED), closing (503 at "
            "closing, gRPC UNAVAILABLE). Each is also counted with outcome rejected.",
            ["reason"],
            registry=registry,
        )
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(reason)
        self.tracing_spans_dropped = Counter(
            PREFIX + "tracing_spans_dropped",
            "Spans dropped because the export queue (OTEL_BSP_MAX_QUEUE_SIZE) was full: a collector slow "
            "or down (--tracing); the traffic is never held for export.",
            registry=registry,
        )
        # The standard process_* families (resident memory, open descriptors against the limit, CPU):
        # what the descriptor reserve and a stalled reader's memory bound are measured against.
        ProcessCollector(registry=registry)

    def track_inflight(self, count: Callable[[], int]) -> None:
        """Read the in-flight count at scrape time: nothing to update on the hot path."""
        self.inflight.set_function(count)

    def count_request(self, code: int, outcome: Outcome, duration: float) -> None:
        counts = self.request_counts
        key = (code, outcome)
        counts[key] = counts.get(key, 0) + 1
        self.duration.observe(duration)

    def count_grpc(self, grpc_status: str, outcome: Outcome, duration: float) -> None:
        self.grpc_requests.labels(grpc_status, outcome).inc()
        self.duration.observe(duration)

    def set_state(self, current: str, states: Iterable[str]) -> None:
        for state in states:
            self.state.labels(state).set(1 if state == current else 0)

    def set_config(
        self, shutdown_drain_secs: int, termination_grace_secs: int | None, advisory_codes: Iterable[str]
    ) -> None:
        self.shutdown_drain_seconds.set(shutdown_drain_secs)
        if termination_grace_secs is not None:
            self.termination_grace_seconds.set(termination_grace_secs)
        for code in advisory_codes:
            self.advisory.labels(code).set(1)


#: A wake takes a model server's cold start: image pull, weights, warm-up (up to the 600 s default
#: activation timeout).
ACTIVATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 450, 600)


class ActivatorMetrics:
    """``drain-router activator``'s own series, beside the router's (:class:`Metrics`: in-flight,
    requests, ``queue_wait_seconds`` and ``admission_rejections`` count the held requests too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Gauge(
            PREFIX + "activator_held_requests",
            "Requests held for a ModelService (namespace/name) until one of its pods' routers answers "
            "ready; not in inflight_requests.",
            ["service"],
            registry=registry,
        )
        self.activations = Counter(
            PREFIX + "activations",
            "Services that went from holding requests to forwarding them (a pod's router answered ready).",
            registry=registry,
        )
        self.activation_seconds = Histogram(
            PREFIX + "activation_seconds",
            "From the first request held for a sleeping service to forwarding (the cold start as the clients saw it).",
            buckets=ACTIVATION_BUCKETS,
            registry=registry,
        )
        self.activation_timeouts = Counter(
            PREFIX + "activation_timeouts",
            "Held requests answered 503 because no pod's router answered ready within "
            "--activation-timeout-secs (each is also one of admission_rejections{reason=queue_timeout}).",
            registry=registry,
        )
        self.refused = Counter(
            PREFIX + "activator_refused",
            "Requests the activator refused without holding them (or answered while held), by its "
            "service's refusal: not_found (no such ModelService), forbidden (reading it answered 403: "
            "not a service this activator may serve), no_grpc_port (a gRPC call for a service with no "
            "spec.router.grpcPort).",
            ["reason"],
            registry=registry,
        )
        for reason in ("not_found", "forbidden", "no_grpc_port"):
            self.refused.labels(reason)


#: The gap a client's stream sees at a cut: a warm prefill on another pod is tens of milliseconds, a
#: cold one up to seconds, a wait for a pod to become ready longer.
GAP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: What became of a cut stream (``front_continuations_total{outcome}``).
CONTINUATION_OUTCOMES = ("continued", "finished", "given_up", "abandoned")


class FrontMetrics:
    """``drain-router front``'s own series, beside the router's (:class:`Metrics`: in-flight, requests,
    admission count the front's clients)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.continuations = Counter(
            PREFIX + "front_continuations",
            "Cut streams (the router's drain_deadline or upstream_truncated event, or the connection cut "
            "mid-stream) by what became of each cut: continued (sent to another pod), finished (the "
            "answer was complete: [DONE] added), given_up (not continuable, or past --max-continuations: "
            "the honest error relayed), abandoned (the continuation did not extend the answer).",
            ["outcome"],
            registry=registry,
        )
        for outcome in CONTINUATION_OUTCOMES:
            self.continuations.labels(outcome)
        self.gap = Histogram(
            PREFIX + "front_continuation_gap_seconds",
            "From a cut to the continuation's first event relayed to the client: what the client's stream waited.",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            PREFIX + "front_retries",
            "Requests sent again to another pod before the model server saw them, by reason: the pod's "
            "router's refusal (closing, queue_timeout, upstream_unavailable, ...; never a 429) or "
            "connect_failed (the pod's router could not be reached).",
            ["reason"],
            registry=registry,
        )
        self.held = Gauge(
            PREFIX + "front_held_requests",
            "Requests held because no pod is ready (scaled to zero, or every pod restarting) or past "
            "--max-concurrent-requests; not in inflight_requests.",
            registry=registry,
        )
        self.ready_pods = Gauge(
            PREFIX + "front_ready_pods",
            "Pods the front sends new requests to: ready, and not leaving (no Connection: close since "
            "their last ready probe).",
            registry=registry,
        )
