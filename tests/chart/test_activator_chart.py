"""The activator in the controller chart (activator.enabled): its Deployment and Service, the
controller's --activator-service naming that Service, the RBAC each side needs and nothing more, the
port map it reads, and the NetworkPolicy that keeps its admin port open. Off by default: nothing of
it is rendered and the controller keeps today's rules."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.controller import settings
from tests.chart import crds, values_sets
from tests.chart.helm import CONTROLLER_CHART, NAMESPACE, Helm, find, flag, one
from tests.chart.test_controller_chart import (
    CONTROLLER,
    DEFAULT_RULES,
    Rule,
    controller_args,
    rules,
)

ACTIVATOR = f"{CONTROLLER}-activator"
ENABLED = values_sets.CONTROLLER_ACTIVATOR

ACTIVATOR_RULES: list[Rule] = [
    (("drainrouter.dev",), ("modelservices",), ("get",)),
    (("drainrouter.dev",), ("modelservices/status",), ("patch",)),
    (("",), ("pods",), ("list",)),
]


def render(helm: Helm, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return helm.template(values, chart=CONTROLLER_CHART)


def _named(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"]["name"].startswith(name)]


def test_off_by_default_renders_nothing_of_it(helm: Helm) -> None:
    docs = render(helm)
    assert not _named(docs, ACTIVATOR) and not find(docs, "ReferenceGrant")
    assert [p["metadata"]["name"] for p in find(docs, "NetworkPolicy")] == [CONTROLLER], "the controller's own"
    assert "--activator-service" not in controller_args(docs)
    assert rules(one(docs, "Role", CONTROLLER)) == DEFAULT_RULES


def test_the_controller_names_the_activators_service_and_admin_port(helm: Helm) -> None:
    """--activator-service is <release namespace>/<the Service's name> (no port: the ports are
    assigned per service), --activator-admin-port the activator's admin port (where /admin/ports
    answers), and the Service selects the activator's pods, never the controller's (nor the
    controller's its)."""
    docs = render(helm, ENABLED)
    service = one(docs, "Service", ACTIVATOR)
    args = controller_args(docs)
    assert flag(args, "--activator-service") == f"{NAMESPACE}/{ACTIVATOR}"
    container = one(docs, "Deployment", ACTIVATOR)["spec"]["template"]["spec"]["containers"][0]
    admin = {p["name"]: p["containerPort"] for p in container["ports"]}["admin"]
    assert flag(args, "--activator-admin-port") == str(admin) == str(settings.DEFAULT_ACTIVATOR_ADMIN_PORT)
    activator = one(docs, "Deployment", ACTIVATOR)
    controller = one(docs, "Deployment", CONTROLLER)
    pod_labels = activator["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert activator["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    controller_selector = controller["spec"]["selector"]["matchLabels"]
    assert not controller_selector.items() <= pod_labels.items(), "the controller's selector matches activator pods"
    controller_pods = controller["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= controller_pods.items()


def test_the_activator_runs_with_the_values_and_probes_its_admin_port(helm: Helm) -> None:
    docs = render(helm, ENABLED)
    activator = one(docs, "Deployment", ACTIVATOR)
    assert activator["spec"]["replicas"] == 2
    pod = activator["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "activator"
    assert flag(args, "--queue-size") == "200" and flag(args, "--activation-timeout-secs") == "300"
    assert flag(args, "--max-services") == "1000"
    assert flag(args, "--shutdown-drain-secs") == "10"
    assert flag(args, "--termination-grace-secs") == str(pod["terminationGracePeriodSeconds"]) == "300"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"admin": 9091} and flag(args, "--admin-port") == "9091"
    assert "--port" not in args and "--grpc-port" not in args  # no shared traffic port: one per service
    assert flag(args, "--ports-configmap") == f"{NAMESPACE}/{ACTIVATOR}-ports"
    assert flag(controller_args(docs), "--activator-ports") == "20000-20999"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert pod["serviceAccountName"] == ACTIVATOR
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    selector = activator["spec"]["selector"]["matchLabels"]
    assert one(docs, "PodDisruptionBudget", ACTIVATOR)["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector},
    }


def test_rbac_the_activator_reads_and_asks_for_a_wake_in_each_watched_namespace(helm: Helm) -> None:
    docs = render(helm, ENABLED)
    roles = [r for r in find(docs, "Role") if r["metadata"]["name"] == ACTIVATOR]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["models", "research", "serving"]
    for role in roles:
        assert rules(role) == ACTIVATOR_RULES
    bindings = [b for b in find(docs, "RoleBinding") if b["metadata"]["name"] == ACTIVATOR]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACTIVATOR, "namespace": NAMESPACE}]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACTIVATOR}
    assert one(docs, "ServiceAccount", ACTIVATOR)


ENDPOINTSLICES: Rule = (("discovery.k8s.io",), ("endpointslices",), ("list", "create", "patch", "delete"))
POLICIES_LIST: Rule = (("networking.k8s.io",), ("networkpolicies",), ("list",))
WAKE_RULES = [
    (("discovery.k8s.io",), ("endpointslices",), (), ("list",)),
    (("",), ("services",), (ACTIVATOR,), ("get",)),
    (("",), ("configmaps",), (f"{ACTIVATOR}-ports",), ("get", "patch")),
    (("",), ("configmaps",), (), ("create",)),
    (("networking.k8s.io",), ("networkpolicies",), (), ("get", "create", "patch", "delete")),
]


def test_rbac_the_controller_never_patches_routes_and_writes_only_its_slices(helm: Helm) -> None:
    """With the activator, the controller's rules in a model namespace add exactly: its activator
    EndpointSlices (list, create, patch, delete) and a list of NetworkPolicies; no route, Service or
    ReferenceGrant write."""
    expected = [*DEFAULT_RULES, ENDPOINTSLICES, POLICIES_LIST]
    for namespace in ("models", "research", "serving"):
        in_namespace = [r for r in find(render(helm, ENABLED), "Role") if r["metadata"]["namespace"] == namespace]
        role = one(in_namespace, "Role", CONTROLLER)
        assert rules(role) == expected
        for rule in role["rules"]:
            if rule["resources"][0] in ("httproutes", "grpcroutes", "services", "referencegrants"):
                assert not {"patch", "update", "create"} & set(rule["verbs"]), rule


def test_rbac_the_controller_writes_the_port_map_and_policies_in_the_activators_namespace(helm: Helm) -> None:
    """A Role of its own in the release's namespace: the one port-map ConfigMap by name (create
    cannot be limited to a name), the NetworkPolicies, and reads of the activator's Service and
    EndpointSlices; bound to the controller's service account only. Not rendered without the
    activator."""
    docs = render(helm, ENABLED)
    role = one(docs, "Role", f"{CONTROLLER}-wake")
    assert role["metadata"]["namespace"] == NAMESPACE
    got = [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames") or ()), tuple(r["verbs"]))
        for r in role["rules"]
    ]
    assert got == WAKE_RULES
    binding = one(docs, "RoleBinding", f"{CONTROLLER}-wake")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == f"{CONTROLLER}-wake"
    assert not find(render(helm), "Role", f"{CONTROLLER}-wake")


def test_the_activator_reads_only_its_port_map(helm: Helm) -> None:
    """The map the controller writes, by name, get only; bound to the activator's account alone."""
    docs = render(helm, ENABLED)
    role = one(docs, "Role", f"{ACTIVATOR}-ports")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [f"{ACTIVATOR}-ports"], "verbs": ["get"]}
    ]
    binding = one(docs, "RoleBinding", f"{ACTIVATOR}-ports")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACTIVATOR, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == f"{ACTIVATOR}-ports"
    assert not find(docs, "ReferenceGrant"), "no route points at the activator any more"


def test_the_activators_admin_port_stays_open_once_a_service_policy_isolates_its_pods(helm: Helm) -> None:
    """The controller's per-service policies select the activator's pods (isolating them for
    ingress); the chart's own policy admits the admin port (from anyone, or from activator.adminFrom)
    and nothing else, and selects exactly the activator's pods."""
    docs = render(helm, ENABLED)
    policy = one(docs, "NetworkPolicy", f"{ACTIVATOR}-admin")
    pod_labels = one(docs, "Deployment", ACTIVATOR)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"] == one(docs, "Service", ACTIVATOR)["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "admin", "protocol": "TCP"}]}]
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = render(helm, {**ENABLED, "activator": {**ENABLED["activator"], "adminFrom": peers}})
    assert one(docs, "NetworkPolicy", f"{ACTIVATOR}-admin")["spec"]["ingress"][0]["from"] == peers


def test_all_namespaces_uses_a_cluster_role(helm: Helm) -> None:
    docs = render(helm, {"watch": {"allNamespaces": True}, "activator": {"enabled": True}})
    cluster_roles = [r for r in find(docs, "ClusterRole") if r["metadata"]["name"] == f"{NAMESPACE}-{ACTIVATOR}"]
    assert [rules(r) for r in cluster_roles] == [ACTIVATOR_RULES]
    assert not [r for r in find(docs, "Role") if r["metadata"]["name"] == ACTIVATOR]


def test_the_activators_service_is_its_admin_port_only(helm: Helm) -> None:
    """No client uses the activator's Service: the controller reads its EndpointSlices to find the
    pods. Its one port is the admin port."""
    service = one(render(helm, ENABLED), "Service", ACTIVATOR)
    assert service["spec"]["ports"] == [{"name": "admin", "port": 9091, "targetPort": "admin", "protocol": "TCP"}]


def test_the_activator_is_scraped_on_its_services_admin_port(helm: Helm) -> None:
    """With monitoring.serviceMonitor.enabled, a ServiceMonitor of its own selects the activator's
    Service (not the controller's metrics Service) and scrapes /metrics on its admin port, the pods'
    port that serves it, with the labels a Prometheus selects ServiceMonitors on."""
    docs = render(helm, ENABLED)
    monitor = one(docs, "ServiceMonitor", ACTIVATOR)
    service = one(docs, "Service", ACTIVATOR)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert not selector.items() <= one(docs, "Service", f"{CONTROLLER}-metrics")["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    container = one(docs, "Deployment", ACTIVATOR)["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] in [p["name"] for p in container["ports"]]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert endpoint["interval"] == one(docs, "ServiceMonitor", CONTROLLER)["spec"]["endpoints"][0]["interval"]
    # The controller's own ServiceMonitor does not select the activator's Service.
    controller_selector = one(docs, "ServiceMonitor", CONTROLLER)["spec"]["selector"]["matchLabels"]
    assert not controller_selector.items() <= service["metadata"]["labels"].items()
    # Behind the same switch, and only with an activator.
    unmonitored = {**ENABLED, "monitoring": {}}
    assert not find(render(helm, unmonitored), "ServiceMonitor")
    assert [
        m["metadata"]["name"] for m in find(render(helm, {"monitoring": ENABLED["monitoring"]}), "ServiceMonitor")
    ] == [CONTROLLER]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"activator": {"enabled": True, "servicePorts": "9000-9100"}}, "is inside activator.servicePorts"),
        ({"activator": {"enabled": True, "servicePorts": "20000"}}, "servicePorts"),
        ({"activator": {"enabled": True, "queueSize": 0}}, "queueSize"),
        (
            {"activator": {"enabled": True, "shutdownDrainSeconds": 30, "terminationGracePeriodSeconds": 30}},
            "must be less than activator.terminationGracePeriodSeconds",
        ),
        ({"activator": {"enabled": True, "surprise": 1}}, "surprise"),
        ({"activator": {"enabled": True, "port": 8080}}, "port"),
    ],
    ids=[
        "admin-port-in-the-service-ports",
        "service-ports-not-a-range",
        "queue-size-0",
        "drain-past-grace",
        "unknown-key",
        "the-old-traffic-port",
    ],
)
def test_bad_activator_values_are_refused_with_the_reason(helm: Helm, values: dict[str, Any], message: str) -> None:
    assert message in helm.template_error(values, chart=CONTROLLER_CHART)


def test_the_model_charts_model_service_names_the_traffic_port_and_the_activation_timeout(helm: Helm) -> None:
    """What the activator needs of a ModelService: the router's traffic port (where it relays held
    requests), and what the controller needs: how long a wake may take; valid against the CRD."""
    values = {
        "router": {"port": 8181},
        "modelService": {
            "enabled": True,
            "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}],
            "activationTimeoutSeconds": 900,
        },
    }
    service = one(helm.template(values), "ModelService")
    assert service["spec"]["router"]["port"] == 8181
    assert service["spec"]["lifecycle"]["activationTimeoutSeconds"] == 900
    crds.validate(service)


def test_the_model_charts_model_service_names_the_grpc_port_when_grpc_is_on(helm: Helm) -> None:
    """spec.router.grpcPort is the router's gRPC port with grpc.enabled (the activator relays held
    calls there), absent without (the activator answers that service's calls UNAVAILABLE)."""
    values: dict[str, Any] = {"modelService": {"enabled": True}}
    assert "grpcPort" not in one(helm.template(values), "ModelService")["spec"]["router"]
    service = one(helm.template({**values, "grpc": {"enabled": True, "port": 8181}}), "ModelService")
    assert service["spec"]["router"]["grpcPort"] == 8181
    crds.validate(service)
