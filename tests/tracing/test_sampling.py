"""Sampling decided before the SDK is asked (:mod:`drain_router.decisions.sampling`): tables for the
rule, the plan read from each sampler ``OTEL_TRACES_SAMPLER`` names, and, under generated trace
contexts, the same decision as the SDK's own sampler for every one of them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import sampling as sdk
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from drain_router.decisions import sampling
from drain_router.decisions.sampling import ALWAYS, Plan, Verdict, decide
from drain_router.tracing.sdk import plan_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HALF = 1 << 63


@pytest.mark.parametrize(
    ("plan", "traceparent", "tracestate", "draw", "expected"),
    [
        pytest.param(Plan(True, ALWAYS), [], [], 7, Verdict(True, 7), id="root-always"),
        pytest.param(Plan(True, 0), [], [], 7, Verdict(False, 7), id="root-never"),
        pytest.param(Plan(True, HALF), [], [], HALF - 1, Verdict(True, HALF - 1), id="root-under-bound"),
        pytest.param(Plan(True, HALF), [], [], HALF, Verdict(False, HALF), id="root-at-bound"),
        pytest.param(Plan(True, HALF), [], [], (5 << 64) | 3, Verdict(True, (5 << 64) | 3), id="root-low-64-bits"),
        pytest.param(
            Plan(True, 0), [f"00-{TRACE}-{SPAN}-01"], [], 7, Verdict(True, int(TRACE, 16), False), id="parent-sampled"
        ),
        pytest.param(
            Plan(True, ALWAYS),
            [f"00-{TRACE}-{SPAN}-00"],
            [],
            7,
            Verdict(False, int(TRACE, 16), False),
            id="parent-not-sampled",
        ),
        pytest.param(
            Plan(True, 0), [f"00-{TRACE}-{SPAN}-03"], [], 7, Verdict(True, int(TRACE, 16), True), id="flags-random-bit"
        ),
        pytest.param(
            Plan(False, 0),
            [f"00-{TRACE}-{SPAN}-01"],
            [],
            7,
            Verdict(False, int(TRACE, 16), False),
            id="not-parent-based",
        ),
        pytest.param(Plan(True, 0), [f"00-{TRACE}-{SPAN}-01"], ["a=b"], 7, None, id="tracestate-to-the-sdk"),
        pytest.param(Plan(True, 0), [f"01-{TRACE}-{SPAN}-01"], [], 7, None, id="other-version-to-the-sdk"),
        pytest.param(Plan(True, 0), [f"00-{'0' * 32}-{SPAN}-01"], [], 7, None, id="zero-trace-to-the-sdk"),
        pytest.param(Plan(True, 0), [f"00-{TRACE}-{'0' * 16}-01"], [], 7, None, id="zero-span-to-the-sdk"),
        pytest.param(Plan(True, 0), [f"00-{TRACE.upper()}-{SPAN}-01"], [], 7, None, id="uppercase-to-the-sdk"),
        pytest.param(Plan(True, 0), [f" 00-{TRACE}-{SPAN}-01"], [], 7, None, id="space-to-the-sdk"),
        pytest.param(Plan(True, 0), [f"00-{TRACE}-{SPAN}-01"] * 2, [], 7, None, id="two-headers-to-the-sdk"),
    ],
)
def test_decide(plan, traceparent, tracestate, draw, expected) -> None:
    assert decide(plan, traceparent, tracestate, draw) == expected


@pytest.mark.parametrize(
    ("sampler", "plan"),
    [
        pytest.param(sdk.ALWAYS_ON, Plan(False, ALWAYS), id="always_on"),
        pytest.param(sdk.ALWAYS_OFF, Plan(False, 0), id="always_off"),
        pytest.param(sdk.TraceIdRatioBased(0.25), Plan(False, 1 << 62), id="traceidratio"),
        pytest.param(sdk.DEFAULT_ON, Plan(True, ALWAYS), id="parentbased_always_on"),
        pytest.param(sdk.DEFAULT_OFF, Plan(True, 0), id="parentbased_always_off"),
        pytest.param(sdk.ParentBasedTraceIdRatio(0.25), Plan(True, 1 << 62), id="parentbased_traceidratio"),
        pytest.param(
            sdk.ParentBased(sdk.ALWAYS_ON, remote_parent_not_sampled=sdk.ALWAYS_ON), None, id="other-delegates"
        ),
        pytest.param(
            sdk.ParentBased(sdk.TraceIdRatioBased(0.5), remote_parent_sampled=sdk.ALWAYS_OFF),
            None,
            id="other-delegates-ratio",
        ),
    ],
)
def test_plan_of_each_sampler_the_environment_names(sampler, plan) -> None:
    assert plan_of(sampler) == plan


SAMPLERS = [
    sdk.ALWAYS_ON,
    sdk.ALWAYS_OFF,
    sdk.DEFAULT_ON,
    sdk.DEFAULT_OFF,
    sdk.TraceIdRatioBased(0.3),
    sdk.ParentBasedTraceIdRatio(0.3),
    sdk.TraceIdRatioBased(0.0),
    sdk.ParentBasedTraceIdRatio(1.0),
]


@given(
    which=st.sampled_from(range(len(SAMPLERS))),
    trace_id=st.integers(1, (1 << 128) - 1),
    span_id=st.integers(1, (1 << 64) - 1),
    flags=st.integers(0, 255),
    with_parent=st.booleans(),
)
def test_the_decision_is_the_sdks(which: int, trace_id: int, span_id: int, flags: int, with_parent: bool) -> None:
    """Whatever the trace context, a decision made before the SDK is the one its sampler makes."""
    sampler = SAMPLERS[which]
    plan = plan_of(sampler)
    assert plan is not None
    header = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    traceparent = [header] if with_parent else []
    verdict = decide(plan, traceparent, [], trace_id)
    assert verdict is not None
    context = TraceContextTextMapPropagator().extract({"traceparent": header}) if with_parent else None
    result = sampler.should_sample(context, trace_id, "GET")
    assert verdict[0] == result.decision.is_sampled()
    assert verdict[1] == trace_id


def test_a_sampled_out_span_passes_its_trace_on_not_sampled() -> None:
    assert (
        sampling.upstream_traceparent(Verdict(False, int(TRACE, 16), False), 1)
        == f"00-{TRACE}-0000000000000001-00".encode()
    )
    assert (
        sampling.upstream_traceparent(Verdict(False, int(TRACE, 16)), 2) == f"00-{TRACE}-0000000000000002-02".encode()
    )


def test_a_root_decided_sampled_is_the_span_the_sdk_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """At ratio 0.5 every root span the router reports sampled is recorded by the SDK in the trace
    decided on (the SDK gets the drawn trace id), and about half are: were the SDK to draw its own
    id and decide again, only about a quarter would be."""
    import random

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from drain_router.tracing.sdk import Tracing

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    tracing = Tracing("test", lambda n: None, exporter=InMemorySpanExporter())
    assert tracing.plan == Plan(True, HALF)
    random.seed(38)
    recorded = 0
    for _ in range(2000):
        span, traceparent, _ = tracing.server("GET", [], [])
        trace_id = int(traceparent.split(b"-")[1], 16)
        assert span.is_recording() == (trace_id & sampling.TRACE_ID_LOW < HALF)
        assert traceparent.endswith(b"-03" if span.is_recording() else b"-02")  # the SDK's flags
        if span.is_recording():
            assert span.get_span_context().trace_id == trace_id
            recorded += 1
        tracing.end(span, {}, None)
    assert 900 <= recorded <= 1100
    tracing.shutdown()
