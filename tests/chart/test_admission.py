"""The router's admission control in the model chart (``router.admission``): its flags, the limit taken
from the engine's own batch flag (stated once, in ``modelServer.args``) and off when unknown, the queue
timeout bounded by the drain window (the router's QUEUE_TIMEOUT_EXCEEDS_DRAIN, refused at render; the
agreement with ``check --strict`` is tests/chart/test_strict_agreement.py), and the autoscaler
counting the queued requests."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import Helm, containers, flag, one
from tests.chart.test_autoscaling import router_gauge_names

ADMISSION_FLAGS = ("--max-concurrent-requests", "--queue-size", "--queue-timeout-secs")


def admission(helm: Helm, values: dict[str, Any]) -> tuple[str | None, ...]:
    """The router's admission flags in the rendered pod (``None``: absent)."""
    args = containers(helm.template(values))["router"]["args"]
    return tuple(flag(args, name) for name in ADMISSION_FLAGS)


def engine(name: str, *args: str, **admission_values: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"modelServer": {"engine": name, "args": list(args)}}
    if name == "custom":
        values["modelServer"].update(image={"repository": "example.com/engine"}, port=8000)
    if admission_values:
        values["router"] = {"admission": admission_values}
    return values


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, (None, None, None), id="vllm-default-batch-unknown-off"),
        pytest.param(engine("sglang"), (None, None, None), id="sglang-default-batch-unknown-off"),
        pytest.param(engine("tgi"), (None, None, None), id="tgi-off"),
        pytest.param(engine("llamacpp"), (None, None, None), id="llamacpp-off"),
        pytest.param(engine("vllm", "--max-num-seqs", "128"), ("128", "256", "30"), id="vllm-max-num-seqs"),
        pytest.param(engine("vllm", "--max-num-seqs=64"), ("64", "256", "30"), id="vllm-max-num-seqs-equals"),
        pytest.param(
            engine("sglang", "--max-running-requests", "48"), ("48", "256", "30"), id="sglang-max-running-requests"
        ),
        pytest.param(
            engine("tgi", "--max-concurrent-requests", "32"), ("32", "256", "30"), id="tgi-max-concurrent-requests"
        ),
        pytest.param(engine("llamacpp", "--parallel", "4"), ("4", "256", "30"), id="llamacpp-parallel"),
        pytest.param(engine("sglang", "--max-num-seqs", "64"), (None, None, None), id="another-engines-flag-ignored"),
        pytest.param(engine("custom", "--max-num-seqs", "64"), (None, None, None), id="custom-engine-unknown"),
        pytest.param(
            engine("vllm", "--max-num-seqs", "128", maxConcurrentRequests=16),
            ("16", "256", "30"),
            id="the-value-wins-over-the-engine-flag",
        ),
        pytest.param(
            engine("vllm", "--max-num-seqs", "128", maxConcurrentRequests=0), (None, None, None), id="zero-turns-it-off"
        ),
        pytest.param(engine("custom", maxConcurrentRequests=8), ("8", "256", "30"), id="custom-engine-by-value"),
        pytest.param(
            engine("vllm", maxConcurrentRequests=8, queueSize=0, queueTimeoutSecs=5), ("8", "0", "5"), id="as-given"
        ),
        pytest.param(
            {**engine("vllm", maxConcurrentRequests=8), "shutdownDrainSecs": 120},
            ("8", "256", "60"),
            id="timeout-null-is-the-routers-default-under-a-longer-drain",
        ),
        pytest.param(
            {**engine("vllm", maxConcurrentRequests=8), "shutdownDrainSecs": 45},
            ("8", "256", "45"),
            id="timeout-null-is-the-drain-when-shorter",
        ),
        pytest.param(
            {
                **engine("vllm", "--max-num-seqs", "64"),
                "shutdownDrainSecs": 0,
                "router": {"readinessProbe": {"declareToRouter": False}},
            },
            ("64", "256", "60"),
            id="timeout-null-with-no-drain-window-is-the-minute",
        ),
        pytest.param(
            {
                "shutdownDrainSecs": 0,
                "router": {
                    "readinessProbe": {"declareToRouter": False},
                    "admission": {"maxConcurrentRequests": 8, "queueTimeoutSecs": 600},
                },
            },
            ("8", "256", "600"),
            id="no-drain-window-takes-any-timeout",
        ),
    ],
)
def test_admission_flags(helm: Helm, values: dict[str, Any], expected: tuple[str | None, ...]) -> None:
    assert admission(helm, values) == expected


def test_the_batch_limit_is_stated_once(helm: Helm) -> None:
    """The number is stated once: the model server gets the flag as written, the router the same value."""
    pod = containers(helm.template(engine("vllm", "--max-num-seqs", "96")))
    assert pod["model-server"]["args"][-2:] == ["--max-num-seqs", "96"]
    assert flag(pod["router"]["args"], "--max-concurrent-requests") == "96"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            engine("vllm", maxConcurrentRequests=8, queueTimeoutSecs=31),
            "queueTimeoutSecs (31) is longer than shutdownDrainSecs (30)",
            id="timeout-over-the-drain",
        ),
        pytest.param(
            engine("vllm", "--max-num-seqs", "lots"),
            'modelServer.args: --max-num-seqs "lots" is not a whole number',
            id="engine-flag-not-a-number",
        ),
    ],
)
def test_bad_combinations_fail_the_render(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(engine("vllm", maxConcurrentRequests=8, queueTimeoutSecs=30), id="timeout-equals-drain"),
        pytest.param(engine("vllm", maxConcurrentRequests=8, queueSize=0, queueTimeoutSecs=600), id="no-queue"),
        pytest.param(engine("vllm", maxConcurrentRequests=0, queueTimeoutSecs=600), id="admission-off"),
    ],
)
def test_what_the_drain_allows_renders(helm: Helm, values: dict[str, Any]) -> None:
    helm.template(values)


@pytest.mark.parametrize(
    ("admission_values", "expected"),
    [
        pytest.param({"maxConcurrentRequests": -1}, "maxConcurrentRequests", id="negative-limit"),
        pytest.param({"queueSize": "many"}, "queueSize", id="word-size"),
        pytest.param({"queueTimeoutSecs": 0}, "queueTimeoutSecs", id="zero-timeout"),
        pytest.param({"queueTimeout": 10}, "queueTimeout", id="typo-key"),
    ],
)
def test_schema_rejects(helm: Helm, admission_values: dict[str, Any], expected: str) -> None:
    error = helm.template_error({"router": {"admission": admission_values}})
    assert "schema" in error and expected in error


def test_hpa_reads_in_flight_plus_queued_with_include_queued(helm: Helm) -> None:
    hpa = one(helm.template(values_sets.OVERLOAD), "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "drain_router_inflight_and_queued_requests"
    plain = one(helm.template({"autoscaling": {"enabled": True}}), "HorizontalPodAutoscaler")
    assert plain["spec"]["metrics"][0]["pods"]["metric"]["name"] == "drain_router_inflight_requests"


def test_keda_query_adds_the_queue_depth_with_include_queued(helm: Helm) -> None:
    keda = {**values_sets.KEDA["autoscaling"], "includeQueued": True}
    query = one(helm.template({"autoscaling": keda}), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    selector = r'namespace="models", pod=~"[^"]+"'
    assert re.fullmatch(
        rf"sum\(\(drain_router_inflight_requests\{{{selector}\}} \+ on \(namespace, pod\)"
        rf" drain_router_queue_depth\{{{selector}\}}\) and on \(namespace, pod\)"
        rf' \(drain_router_state\{{{selector}, state="serving"\}} == 1\)\)',
        query,
    ), query


def test_the_query_reads_only_metrics_the_router_exports(helm: Helm) -> None:
    """docs/metrics.md names drain_router_queue_depth; the router's admission gate exports it (until a router
    does, that one name is only checked against the docs)."""
    keda = {**values_sets.KEDA["autoscaling"], "includeQueued": True}
    query = one(helm.template({"autoscaling": keda}), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    names = set(re.findall(r"drain_router_[a-z_]+", query))
    assert names == {"drain_router_inflight_requests", "drain_router_queue_depth", "drain_router_state"}
    exported = router_gauge_names()
    if "drain_router_queue_depth" not in exported:
        names.discard("drain_router_queue_depth")
    assert names <= exported
