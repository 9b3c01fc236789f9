"""Autoscaling on the routers' in-flight requests: a HorizontalPodAutoscaler (or a KEDA ScaledObject)
on the Deployment, and no ``replicas`` in the Deployment then, so ``helm upgrade`` keeps the count
the autoscaler chose."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from drain_router import metrics
from tests.chart import values_sets
from tests.chart.helm import CHART, NAMESPACE, RELEASE, Helm, find, model_deployment, one

FULLNAME = f"{RELEASE}-drain-router"
HPA = values_sets.PLATFORM
KEDA = values_sets.KEDA


def router_gauge_names() -> set[str]:
    """The metric names a router exports (a fresh registry)."""
    registry = CollectorRegistry()
    metrics.Metrics(registry)
    return {family.name for family in registry.collect()}


def test_without_autoscaling_the_deployment_keeps_its_replicas(helm: Helm) -> None:
    docs = helm.template({"workload": {"replicas": 3}})
    assert model_deployment(docs)["spec"]["replicas"] == 3
    assert not find(docs, "HorizontalPodAutoscaler") and not find(docs, "ScaledObject")


@pytest.mark.parametrize("values", [pytest.param(HPA, id="hpa"), pytest.param(KEDA, id="keda")])
def test_with_autoscaling_the_deployment_has_no_replicas(helm: Helm, values: dict[str, Any]) -> None:
    """A replicas field would reset the autoscaler's count at every helm upgrade."""
    spec = model_deployment(helm.template({**values, "workload": {**values.get("workload", {}), "replicas": 3}}))
    assert "replicas" not in spec["spec"]


def test_hpa_scales_the_deployment_on_in_flight_requests_per_pod(helm: Helm) -> None:
    docs = helm.template(HPA)
    hpa = one(docs, "HorizontalPodAutoscaler", FULLNAME)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": model_deployment(docs)["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    (metric,) = hpa["spec"]["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "drain_router_inflight_requests"},
            "target": {"type": "AverageValue", "averageValue": "24"},
        },
    }
    assert not find(docs, "ScaledObject")


def test_the_metric_is_the_one_the_router_exports() -> None:
    values = values_sets.merged({})
    assert values["autoscaling"]["metricName"] in router_gauge_names()


def test_default_scale_down_is_slow_and_one_pod_at_a_time(helm: Helm) -> None:
    """Each scale-down drains a pod; a pod that comes back loads the model for minutes."""
    behavior = one(helm.template(HPA), "HorizontalPodAutoscaler")["spec"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    assert "scaleUp" not in behavior, "scale-up keeps the Kubernetes default"
    custom = {"scaleUp": {"stabilizationWindowSeconds": 30}}
    hpa = one(
        helm.template({"autoscaling": {"enabled": True, "behavior": {"scaleDown": None, **custom}}}),
        "HorizontalPodAutoscaler",
    )
    assert hpa["spec"]["behavior"] == custom


def test_keda_scaled_object_replaces_the_hpa(helm: Helm) -> None:
    docs = helm.template(KEDA)
    assert not find(docs, "HorizontalPodAutoscaler"), "KEDA creates and owns its own HPA"
    so = one(docs, "ScaledObject", FULLNAME)
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 4)
    assert (
        so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        == 600
    )
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert trigger["metadata"]["threshold"] == "16"


def test_keda_query_sums_this_releases_pods_and_no_others(helm: Helm) -> None:
    query = one(helm.template(KEDA), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    selector = r'namespace="models", pod=~"([^"]+)"'
    match = re.fullmatch(
        rf"sum\(drain_router_inflight_requests\{{{selector}\}} and on \(namespace, pod\)"
        rf' \(drain_router_state\{{{selector}, state="serving"\}} == 1\)\)',
        query,
    )
    assert match, query
    assert match.group(1) == match.group(2)
    assert {"drain_router_inflight_requests", "drain_router_state"} <= router_gauge_names()
    pods = re.compile(match.group(1))  # PromQL anchors the regex at both ends, as fullmatch does
    assert pods.fullmatch("llama-drain-router-5d8f7c9b4-x2x7z")
    assert not pods.fullmatch("llama-big-drain-router-5d8f7c9b4-x2x7z")
    assert not pods.fullmatch("llama-drain-router-v2-5d8f7c9b4-x2x7z"), "release llama-drain-router-v2"
    own = {"enabled": True, "keda": {**KEDA["autoscaling"]["keda"], "query": "sum(up)"}}
    assert one(helm.template({"autoscaling": own}), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"] == (
        "sum(up)"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
            "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (2)",
            id="min-above-max",
        ),
        pytest.param(
            {"autoscaling": {"enabled": True, "keda": {"enabled": True}}},
            "needs autoscaling.keda.serverAddress",
            id="keda-without-prometheus",
        ),
        pytest.param(
            {"autoscaling": {"keda": {"enabled": True, "serverAddress": "http://p:9090"}}},
            "autoscaling.keda.enabled needs autoscaling.enabled",
            id="keda-without-autoscaling",
        ),
        pytest.param(
            {
                **KEDA,
                "modelService": {
                    "enabled": True,
                    "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}],
                },
            },
            "KEDA scales a Deployment below minReplicaCount straight back up",
            id="keda-with-scale-to-zero",
        ),
    ],
)
def test_bad_combinations_fail_the_render(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"autoscaling": {"minReplicas": 0}}, "/autoscaling/minReplicas", id="min-zero"),
        pytest.param({"autoscaling": {"targetInflightPerPod": 0}}, "/autoscaling/targetInflightPerPod", id="target-0"),
        pytest.param({"autoscaling": {"targetInflightPerPod": "16"}}, "targetInflightPerPod", id="target-string"),
        pytest.param({"autoscaling": {"behaviour": {}}}, "behaviour", id="typo-key"),
        pytest.param({"autoscaling": {"behavior": {"scaledown": {}}}}, "scaledown", id="typo-behavior"),
        pytest.param({"autoscaling": {"keda": {"serverAddress": "prometheus:9090"}}}, "serverAddress", id="no-scheme"),
    ],
)
def test_schema_rejects(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(values)
    assert "schema" in error
    assert expected in error


def test_scale_to_zero_with_the_hpa_is_allowed(helm: Helm) -> None:
    """The HPA leaves a Deployment at 0 replicas alone (ScalingDisabled) until it is scaled up again."""
    docs = helm.template(
        {
            **HPA,
            "modelService": {
                "enabled": True,
                "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}],
            },
        }
    )
    one(docs, "HorizontalPodAutoscaler"), one(docs, "ModelService")


def notes(helm: Helm, *sets: str) -> str:
    args = [arg for s in sets for arg in ("--set", s)]
    done = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_name_the_autoscaler_and_warn_when_nothing_scrapes_the_routers(helm: Helm) -> None:
    hpa = notes(helm, "autoscaling.enabled=true")
    assert "HorizontalPodAutoscaler llama-drain-router, 1-4 pods at 16 in-flight requests per pod" in hpa
    assert "/apis/custom.metrics.k8s.io/v1beta1/namespaces/models/pods/*/drain_router_inflight_requests" in hpa
    assert "WARNING: monitoring.podMonitor.enabled is false" in hpa
    scraped = notes(helm, "autoscaling.enabled=true", "monitoring.podMonitor.enabled=true")
    assert "HorizontalPodAutoscaler" in scraped and "WARNING" not in scraped
    assert "Autoscaling" not in notes(helm)
