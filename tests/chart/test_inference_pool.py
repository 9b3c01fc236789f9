"""Gateway API Inference Extension: the route may send to an InferencePool (the endpoint picker
chooses the pod) instead of the Service; the pool selects exactly the model server pods on the
router's traffic port, and the ModelService tears it down route first."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import crds, values_sets
from tests.chart.helm import RELEASE, Helm, find, flag, model_deployment, one

FULLNAME = f"{RELEASE}-drain-router"
POOL = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "name": FULLNAME}


def test_pool_selects_the_model_pods_on_the_routers_traffic_port(helm: Helm) -> None:
    docs = helm.template(values_sets.INFERENCE_POOL)
    pool = one(docs, "InferencePool")
    crds.validate(pool)
    deployment = model_deployment(docs)
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    router = deployment["spec"]["template"]["spec"]["containers"][0]
    traffic = {p["name"]: p["containerPort"] for p in router["ports"]}["http"]
    assert pool["spec"]["targetPorts"] == [{"number": traffic}], "through the router, never the model server"
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "llama-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


def test_route_targets_the_pool(helm: Helm) -> None:
    docs = helm.template(values_sets.INFERENCE_POOL)
    (rule,) = one(docs, "HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": FULLNAME}]


def test_model_service_removes_the_route_then_the_pool_then_the_workload(helm: Helm) -> None:
    docs = helm.template(values_sets.INFERENCE_POOL)
    ms = one(docs, "ModelService")
    crds.validate(ms)
    assert ms["spec"]["route"]["kind"] == "HTTPRoute"
    assert ms["spec"]["workload"][0] == POOL, "the pool goes first once the route is gone"
    assert [w["kind"] for w in ms["spec"]["workload"]] == ["InferencePool", "Deployment", "Service"]
    pool = one(docs, "InferencePool")
    assert pool["metadata"]["labels"]["drainrouter.dev/service"] == ms["metadata"]["name"]
    assert pool["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_without_an_http_route_the_pool_is_the_route(helm: Helm) -> None:
    docs = helm.template(values_sets.POOL_WITHOUT_ROUTE)
    ms = one(docs, "ModelService")
    assert ms["spec"]["route"] == POOL
    assert [w["kind"] for w in ms["spec"]["workload"]] == ["Deployment", "Service"]
    assert not find(docs, "HTTPRoute")
    assert one(docs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


def test_pool_needs_an_endpoint_picker_and_the_route_needs_the_pool(helm: Helm) -> None:
    error = helm.template_error({"inferencePool": {"enabled": True}})
    assert "endpointPicker" in error, error
    error = helm.template_error(
        {"httpRoute": {"enabled": True, "backend": "InferencePool", "parentRefs": [{"name": "g"}]}}
    )
    assert "needs inferencePool.enabled" in error
    assert "backend" in helm.template_error({"httpRoute": {"backend": "Pool"}})
    assert not find(helm.template(), "InferencePool"), "off by default"


def test_pod_monitor_scrapes_the_routers_admin_port(helm: Helm) -> None:
    docs = helm.template(values_sets.FULL)
    monitor = one(docs, "PodMonitor")
    crds.validate(monitor)
    deployment = model_deployment(docs)
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    endpoint, engine = monitor["spec"]["podMetricsEndpoints"]
    router = deployment["spec"]["template"]["spec"]["containers"][0]
    assert endpoint["port"] in {p["name"] for p in router["ports"]} and endpoint["port"] == "admin"
    assert endpoint["path"] == "/metrics"
    # The engine's own metrics: relayed uncounted on the admin port, never scraped on the traffic port.
    assert (engine["port"], engine["path"]) == ("admin", "/engine/metrics")
    assert flag(router["args"], "--engine-metrics-path") == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not find(helm.template(), "PodMonitor"), "off by default"


@pytest.mark.parametrize(
    "values",
    [
        {"monitoring": {"podMonitor": {"enabled": True, "engineMetrics": False}}},
        {"monitoring": {"podMonitor": {"enabled": True}}, "router": {"engineMetricsPath": ""}},
    ],
    ids=["engine-metrics-off", "engine-path-empty"],
)
def test_pod_monitor_without_the_engines_metrics(helm: Helm, values: dict[str, Any]) -> None:
    docs = helm.template(values)
    (endpoint,) = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
