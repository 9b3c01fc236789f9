"""The NetworkPolicy: the traffic port open, the router's admin port only for the controller (and
the peers the operator lists). Checked by evaluating the rendered policy against the labels of the
pods the charts themselves render: the model chart's and the controller chart's."""

from __future__ import annotations

from typing import Any

from tests.chart import netpol, values_sets
from tests.chart.helm import CONTROLLER_CHART, NAMESPACE, Helm, find, model_deployment, one


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return netpol.selects(selector, labels)


def _allowed(policy: dict[str, Any], pod_labels: dict[str, str], port: int, namespace: str = NAMESPACE) -> bool:
    """Whether a pod of ``namespace`` with ``pod_labels`` may connect to ``port`` of the policy's pods."""
    target = netpol.Pod(namespace=NAMESPACE, labels=dict(policy["spec"]["podSelector"]["matchLabels"]))
    return netpol.ingress_allowed([policy], netpol.Pod(namespace=namespace, labels=pod_labels), target, port)


def _pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def _controller_pod_labels(helm: Helm, namespace: str = NAMESPACE) -> dict[str, str]:
    """The labels of the controller chart's pod, installed as release drain-router-controller."""
    docs = helm.template(chart=CONTROLLER_CHART, release="drain-router-controller", namespace=namespace)
    return _pod_labels(one(docs, "Deployment"))


def test_admin_port_is_closed_to_everyone_but_the_controller(helm: Helm) -> None:
    docs = helm.template()
    policy = one(docs, "NetworkPolicy")
    model = model_deployment(docs)
    assert _selects(policy["spec"]["podSelector"], _pod_labels(model)), "it applies to the model server pods"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    client = {"app": "gateway"}
    assert _allowed(policy, client, 8080), "anyone reaches the traffic port"
    assert not _allowed(policy, client, 9091), "a client does not reach the admin port"
    assert not _allowed(policy, client, 8000), "nor the model server's own port"
    controller = _controller_pod_labels(helm, namespace="drain-router-system")
    assert _allowed(policy, controller, 9091, namespace="drain-router-system"), (
        "the controller's idle probe does, from the namespace the README installs it in"
    )
    assert not _allowed(policy, controller, 9091), "the same labels in the model's namespace do not"
    assert not _allowed(policy, controller, 9091, namespace="elsewhere"), "nor elsewhere"
    assert not _allowed(policy, _pod_labels(model), 9091), "another model pod does not"


def test_an_empty_controller_namespace_means_the_releases_own(helm: Helm) -> None:
    """A controller installed beside the model (watch.namespaces): networkPolicy.controller.namespace ""."""
    policy = one(helm.template({"networkPolicy": {"controller": {"namespace": ""}}}), "NetworkPolicy")
    controller = _controller_pod_labels(helm)
    assert _allowed(policy, controller, 9091)
    assert not _allowed(policy, controller, 9091, namespace="drain-router-system")


def test_a_controller_in_its_own_namespace_is_admitted(helm: Helm) -> None:
    policy = one(helm.template(values_sets.OTHER_SERVER), "NetworkPolicy")
    controller = _controller_pod_labels(helm, namespace="drain-router-system")
    assert _allowed(policy, controller, 9191, namespace="drain-router-system")
    assert not _allowed(policy, controller, 9191, namespace=NAMESPACE)


def test_ports_follow_the_router_values_and_extra_peers_are_added(helm: Helm) -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    values = {
        **values_sets.OTHER_SERVER,
        "networkPolicy": {
            "enabled": True,
            "adminFrom": [monitoring],
            "trafficFrom": [{"podSelector": {"matchLabels": {"app": "gw"}}}],
        },
    }
    policy = one(helm.template(values), "NetworkPolicy")
    assert _allowed(policy, {"app": "gw"}, 8081)
    assert not _allowed(policy, {"app": "other"}, 8081), "trafficFrom narrows the traffic port"
    assert not _allowed(policy, {"app": "gw"}, 9091)
    admin_rule = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": 9191, "protocol": "TCP"}]]
    assert monitoring in admin_rule[0]["from"]


def test_without_a_controller_the_admin_port_is_closed_to_every_pod(helm: Helm) -> None:
    policy = one(helm.template({"networkPolicy": {"controller": {"enabled": False}}}), "NetworkPolicy")
    assert _allowed(policy, {"app": "gateway"}, 8080)
    assert not _allowed(policy, {"app": "gateway"}, 9091)
    assert all(rule.get("from") != [] for rule in policy["spec"]["ingress"]), "an empty from would allow all"


def test_it_can_be_turned_off(helm: Helm) -> None:
    assert not find(helm.template({"networkPolicy": {"enabled": False}}), "NetworkPolicy")
    assert not find(helm.template({"networkPolicy": {"enabled": False}}, chart=CONTROLLER_CHART), "NetworkPolicy")


def test_the_activator_reaches_a_restricted_traffic_port_but_not_the_admin_port(helm: Helm) -> None:
    """trafficFrom set: the activator's pods (their labels as the controller chart renders them, in
    the namespace the README installs it in) still reach the traffic port, where they relay held
    requests and ask /readyz; the admin port stays the controller's."""
    docs = helm.template(
        chart=CONTROLLER_CHART,
        release="drain-router-controller",
        namespace="drain-router-system",
        values={"activator": {"enabled": True}},
    )
    activator = _pod_labels(one(docs, "Deployment", "drain-router-controller-activator"))
    restricted = {"networkPolicy": {"trafficFrom": [{"podSelector": {"matchLabels": {"app": "gw"}}}]}}
    policy = one(helm.template(restricted), "NetworkPolicy")
    assert _allowed(policy, activator, 8080, namespace="drain-router-system")
    assert not _allowed(policy, activator, 8080, namespace="elsewhere")
    assert not _allowed(policy, activator, 9091, namespace="drain-router-system")
    assert not _allowed(policy, {"app": "other"}, 8080)
    off = {"networkPolicy": {**restricted["networkPolicy"], "activator": {"enabled": False}}}
    assert not _allowed(one(helm.template(off), "NetworkPolicy"), activator, 8080, namespace="drain-router-system")
