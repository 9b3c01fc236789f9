"""The controller's own NetworkPolicy (ingress to its metrics and health ports from the named peers
only, egress open), evaluated with the ``netpol`` model, and the activator's probe settings."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart.helm import CHART, CONTROLLER_CHART, NAMESPACE, Helm, find, one
from tests.chart.netpol import Pod, ingress_allowed
from tests.chart.test_controller_chart import CONTROLLER

ACTIVATOR = f"{CONTROLLER}-activator"
METRICS, HEALTH = 9092, 8081
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
NEIGHBOUR = Pod(NAMESPACE, {"app": "anything"})
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
NODES = [{"ipBlock": {"cidr": "10.0.0.0/16"}}]


def render(helm: Helm, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return helm.template({"activator": {"enabled": True}, **(values or {})}, chart=CONTROLLER_CHART)


def reachable(docs: list[dict[str, Any]], source: Pod, port: int) -> bool:
    target = Pod.of(one(docs, "Deployment", CONTROLLER), NAMESPACE)
    return ingress_allowed(docs, source, target, port)


def test_by_default_nothing_reaches_the_controller_and_its_egress_is_open(helm: Helm) -> None:
    docs = render(helm)
    policy = one(docs, "NetworkPolicy", CONTROLLER)
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress open: the API server cannot be named"
    assert policy["spec"]["ingress"] == []
    labels = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    activator = one(docs, "Deployment", ACTIVATOR)["spec"]["template"]["metadata"]["labels"]
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= activator.items()
    for source in (PROMETHEUS, NEIGHBOUR):
        for port in (METRICS, HEALTH):
            assert not reachable(docs, source, port), (source, port)


def test_metrics_and_health_peers_each_open_their_own_port(helm: Helm) -> None:
    docs = render(helm, {"networkPolicy": {"enabled": True, "metricsFrom": MONITORING, "healthFrom": NODES}})
    assert reachable(docs, PROMETHEUS, METRICS)
    assert not reachable(docs, PROMETHEUS, HEALTH), "Prometheus is named for the metrics port only"
    assert not reachable(docs, NEIGHBOUR, METRICS)
    rules = one(docs, "NetworkPolicy", CONTROLLER)["spec"]["ingress"]
    assert rules[1] == {"from": NODES, "ports": [{"port": "health", "protocol": "TCP"}]}


def test_no_metrics_port_no_metrics_rule(helm: Helm) -> None:
    values = {"metricsPort": 0, "networkPolicy": {"enabled": True, "metricsFrom": MONITORING, "healthFrom": []}}
    assert one(render(helm, values), "NetworkPolicy", CONTROLLER)["spec"]["ingress"] == []


def test_disabled_renders_no_controller_policy(helm: Helm) -> None:
    docs = render(helm, {"networkPolicy": {"enabled": False, "metricsFrom": [], "healthFrom": []}})
    assert not find(docs, "NetworkPolicy", CONTROLLER)
    assert reachable(docs, PROMETHEUS, METRICS)


def _probes(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (container,) = one(docs, "Deployment", ACTIVATOR)["spec"]["template"]["spec"]["containers"]
    return container["readinessProbe"], container["livenessProbe"]


def test_activator_probes_have_the_routers_timeouts(helm: Helm) -> None:
    """The 1 s Kubernetes default would take a busy activator out; the router's own are 2 s."""
    router = yaml.safe_load((CHART / "values.yaml").read_text())["router"]
    readiness, liveness = _probes(render(helm))
    assert readiness["timeoutSeconds"] == router["readinessProbe"]["timeoutSeconds"] == 2
    assert liveness["timeoutSeconds"] == router["livenessProbe"]["timeoutSeconds"] == 2
    assert liveness["periodSeconds"] == router["livenessProbe"]["periodSeconds"]
    assert liveness["failureThreshold"] == router["livenessProbe"]["failureThreshold"]
    assert (readiness["periodSeconds"], readiness["failureThreshold"], readiness["successThreshold"]) == (2, 1, 1)


def test_activator_probe_values_reach_the_pod(helm: Helm) -> None:
    values = {
        "activator": {
            "enabled": True,
            "shutdownDrainSeconds": 20,
            "readinessProbe": {"periodSeconds": 5, "failureThreshold": 3, "successThreshold": 2, "timeoutSeconds": 4},
            "livenessProbe": {"periodSeconds": 20, "failureThreshold": 5, "timeoutSeconds": 6},
        }
    }
    readiness, liveness = _probes(helm.template(values, chart=CONTROLLER_CHART))
    assert readiness == {
        "httpGet": {"path": "/readyz", "port": "admin"},
        "periodSeconds": 5, "failureThreshold": 3, "successThreshold": 2, "timeoutSeconds": 4,
    }  # fmt: skip
    assert liveness == {
        "httpGet": {"path": "/livez", "port": "admin"}, "periodSeconds": 20, "failureThreshold": 5, "timeoutSeconds": 6,
    }  # fmt: skip


@pytest.mark.parametrize(("drain", "refused"), [(15, True), (16, False), (0, False)])
def test_activator_drain_must_outlast_its_readiness_window(helm: Helm, drain: int, refused: bool) -> None:
    """A draining activator leaves the endpoints after period x failureThreshold; a drain no longer
    than that closes while the Service still sends to it. 0 (no drain pause) is allowed."""
    values = {
        "activator": {
            "enabled": True,
            "shutdownDrainSeconds": drain,
            "readinessProbe": {"periodSeconds": 5, "failureThreshold": 3},
        }
    }
    if refused:
        error = helm.template_error(values, chart=CONTROLLER_CHART)
        assert "activator.shutdownDrainSeconds=15 must be above the readiness probe window" in error
    else:
        helm.template(values, chart=CONTROLLER_CHART)
