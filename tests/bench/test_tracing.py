"""The tracing workload's pure parts: the sink's span count over the OTLP wire format, its HTTP
answers, the ratios, goals and table from records, and what the routers' /metrics say."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench import otlp_sink, report, tracing_overhead, tracing_report

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
common = pytest.importorskip("opentelemetry.proto.common.v1.common_pb2")
resource_pb = pytest.importorskip("opentelemetry.proto.resource.v1.resource_pb2")
trace_pb = pytest.importorskip("opentelemetry.proto.trace.v1.trace_pb2")


def _request(shape: list[list[int]]) -> bytes:
    """An ExportTraceServiceRequest: per resource, per scope, that many spans, each with attributes,
    an event and a status (fields of every wire type before and after the spans)."""
    message = pb.ExportTraceServiceRequest()
    for r, scopes in enumerate(shape):
        resource_spans = message.resource_spans.add()
        resource_spans.resource.CopyFrom(
            resource_pb.Resource(
                attributes=[common.KeyValue(key="service.name", value=common.AnyValue(string_value="r"))]
            )
        )
        for s, count in enumerate(scopes):
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = f"scope{s}"
            for i in range(count):
                span = scope_spans.spans.add()
                span.trace_id = bytes(range(16))
                span.span_id = bytes([r, s, i, 0, 0, 0, 0, 1])
                span.name = "GET"
                span.kind = trace_pb.Span.SPAN_KIND_SERVER
                span.start_time_unix_nano = 1_700_000_000_000_000_000 + i
                span.end_time_unix_nano = 1_700_000_000_000_100_000 + i
                span.attributes.add(key="http.response.status_code", value=common.AnyValue(int_value=200))
                span.attributes.add(key="ratio", value=common.AnyValue(double_value=0.5))
                span.events.add(name="drain_router.drain_started", time_unix_nano=1)
                span.status.code = trace_pb.Status.STATUS_CODE_OK
            scope_spans.schema_url = "https://opentelemetry.io/schemas/1.21.0"
        resource_spans.schema_url = "x"
    return bytes(message.SerializeToString())


@pytest.mark.parametrize("shape", [[], [[0]], [[1]], [[3, 2], [4]], [[], [0, 7]]])
def test_the_sink_counts_every_span_of_a_request(shape: list[list[int]]) -> None:
    assert otlp_sink.count_spans(_request(shape)) == sum(map(sum, shape))


def test_the_sink_counts_what_the_sdk_exporter_sends() -> None:
    """Spans of the real SDK, encoded by the OTLP exporter's own encoder."""
    encoder = pytest.importorskip("opentelemetry.exporter.otlp.proto.common.trace_encoder")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("a")
    for i in range(5):
        with tracer.start_as_current_span("GET", attributes={"n": i, "url.path": "/small"}):
            pass
    with provider.get_tracer("b").start_as_current_span("POST"):
        pass
    body = encoder.encode_spans(memory.get_finished_spans()).SerializeToString()
    assert otlp_sink.count_spans(body) == 6


def test_a_malformed_request_is_refused_not_miscounted() -> None:
    body = _request([[2]])
    with pytest.raises(ValueError):
        otlp_sink.count_spans(body[:-3])
    with pytest.raises(ValueError):
        otlp_sink.count_spans(b"\x0f")  # wire type 7


async def test_the_sink_answers_200_and_counts_per_path() -> None:
    """1. two plain POSTs to one router's path, a gzip one to another's 2. GET /stats.
    Result: every POST answered 200; per path the requests, bytes (uncompressed) and spans."""
    async with TestClient(TestServer(otlp_sink.app())) as client:
        body = _request([[3]])
        for _ in range(2):
            resp = await client.post("/ratio1/v1/traces", data=body)
            assert resp.status == 200
        packed = gzip.compress(_request([[1, 1]]))
        resp = await client.post("/ratio0/v1/traces", data=packed, headers={"Content-Encoding": "gzip"})
        assert resp.status == 200
        stats = await (await client.get("/stats")).json()
    assert stats["/ratio1/v1/traces"] == {"requests": 2, "bytes": 2 * len(body), "spans": 6, "undecoded": 0}
    assert stats["/ratio0/v1/traces"] == {"requests": 1, "bytes": len(_request([[1, 1]])), "spans": 2, "undecoded": 0}


def test_router_metrics_are_summed_over_labels() -> None:
    text = (
        "# HELP drain_router_requests_total x\n"
        'drain_router_requests_total{code="200",outcome="completed"} 1500.0\n'
        'drain_router_requests_total{code="503",outcome="rejected"} 2.0\n'
        "drain_router_requests_created 1.7e9\n"
        "drain_router_tracing_spans_dropped_total 0.0\n"
    )
    served = tracing_overhead.metric_sum(text, "drain_router_requests_total")
    assert served == 1502 and isinstance(served, int)
    assert tracing_overhead.metric_sum(text, "drain_router_tracing_spans_dropped_total") == 0.0
    assert tracing_overhead.metric_sum(text, "drain_router_absent_total") is None
    assert tracing_overhead.spans_per_unit({"spans_exported": 30, "requests": 60}, "requests") == 0.5
    assert tracing_overhead.spans_per_unit({"spans_exported": 30, "requests": 0}, "requests") is None


def _records(cpu: dict[str, list[float]], rate: dict[str, list[float]]) -> list[dict[str, Any]]:
    out = []
    for arm in cpu:
        for rnd, (c, r) in enumerate(zip(cpu[arm], rate[arm], strict=True)):
            metrics = {"target_cpu_us_per_unit": c, "rate": r, "spans_per_unit": 1.0 if arm == "ratio1" else 0.0}
            out.append({"round": rnd, "workload": "tracing_small_get", "target": arm, "metrics": metrics})
    return out


def test_ratios_are_per_round_then_the_median() -> None:
    """Each arm over off in the same round: off drifting between rounds does not enter the ratio."""
    records = _records(
        {"off": [20.0, 40.0, 30.0], "ratio0": [20.2, 40.8, 33.0], "ratio1": [30.0, 60.0, 45.0]},
        {"off": [100.0, 50.0, 80.0], "ratio0": [100.0, 50.0, 80.0], "ratio1": [50.0, 25.0, 40.0]},
    )
    got = tracing_report.ratio(records, "tracing_small_get", "ratio0", "target_cpu_us_per_unit")
    assert (got["median"], got["min"], got["max"]) == pytest.approx((1.02, 1.01, 1.1))
    assert tracing_report.ratio(records, "tracing_small_get", "ratio1", "rate")["median"] == 0.5
    goals = tracing_report.goals(records)
    assert [(g["threshold"], g["met"]) for g in goals] == [(1.03, True), (1.25, False)]
    assert goals[1]["measured"] == pytest.approx(1.5) and goals[1]["margin"] == pytest.approx(-0.2)


def test_goals_say_why_an_arm_was_not_measured() -> None:
    records = _records({"off": [20.0], "ratio0": [21.0]}, {"off": [1.0], "ratio0": [1.0]})
    records.append({"round": 0, "workload": "tracing_small_get", "target": "ratio1", "metrics": {"skipped": "no SDK"}})
    goals = tracing_report.goals(records)
    assert goals[1]["measured"] is None and goals[1]["note"] == "no SDK"
    assert tracing_report.goals([{"round": 0, "workload": "small_get", "target": "router", "metrics": {}}]) == []


def test_the_tracing_table_and_its_place_in_the_report() -> None:
    """The table has a row per arm with its ratios to off and the sink's totals; the records belong to
    the tracing group, not to small GET's goals or rows."""
    records = _records(
        {"off": [20.0, 22.0], "ratio0": [21.0, 22.0], "ratio1": [40.0, 44.0]},
        {a: [9.0, 9.0] for a in ("off", "ratio0", "ratio1")},
    )
    totals = {
        "spans_exported": 1000,
        "export_requests": 2,
        "export_bytes": 500_000,
        "requests_served": 1000,
        "spans_dropped": 0,
    }
    records.append({"round": 0, "workload": "tracing_totals", "target": "ratio1", "metrics": totals})
    text = tracing_report.markdown(records, {"small_connections": 64, "paced_interval_ms": 30})
    assert (
        "| small GET, 64 connections (req/s, per request) | `--tracing`, ratio 1 | 9.00 | 1.00x | 42.0 µs (40.0–44.0) | 2.00x | 1.00 |"
        in text
    )
    assert (
        "ratio 1: 1,000 spans in 2 export requests (0.5 MiB, 500 B a span) for 1,000 requests served, 0 dropped" in text
    )
    assert (
        report._group("tracing_sse_paced_256") == "tracing" and report._family("tracing_sse_paced_256") == "sse_paced"
    )
    results = {"records": records, "plan": {"small_connections": 64, "hold_steps": [20]}}
    goals = report.goals(results, {"ratios": {}, "summary": {}})
    assert [g["goal"].split(" with ")[0] for g in goals] == ["router CPU per small GET"] * 2
