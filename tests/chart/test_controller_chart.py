"""The controller chart: installed once, two replicas electing a leader on a Lease (one replica and
Recreate without leader election), liveness on /healthz, and RBAC that is exactly what the enabled
features call. Broadening a rule fails here on
purpose: change the expected rules only together with the controller code that needs them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import CONTROLLER_CHART, NAMESPACE, RELEASE, Helm, find, flag, one

Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]

CONTROLLER = f"{RELEASE}-drain-router-controller"
LEADER_ELECTION = f"{CONTROLLER}-leader-election"
LEASES: Rule = (("coordination.k8s.io",), ("leases",), ("get", "create", "update"))

MODELSERVICES_READ: Rule = (("drainrouter.dev",), ("modelservices",), ("get", "list", "watch", "patch"))
MODELSERVICES_DELETE: Rule = (("drainrouter.dev",), ("modelservices",), ("get", "list", "watch", "patch", "delete"))
STATUS: Rule = (("drainrouter.dev",), ("modelservices/status",), ("patch",))
EVENTS: Rule = (("",), ("events",), ("create",))
PODS_LIST: Rule = (("",), ("pods",), ("list",))
PODS_DELETE: Rule = (("",), ("pods",), ("list", "delete"))
EVICTION: Rule = (("",), ("pods/eviction",), ("create",))
SERVICES: Rule = (("",), ("services",), ("get", "delete"))
DEPLOYMENTS: Rule = (("apps",), ("deployments",), ("get", "delete"))
DEPLOYMENTS_PATCH: Rule = (("apps",), ("deployments",), ("get", "delete", "patch"))
REPLICASETS: Rule = (("apps",), ("replicasets",), ("get",))
"""Whether a selected pod is the service's: its ReplicaSet's controller (always granted)."""
HTTPROUTES: Rule = (("gateway.networking.k8s.io",), ("httproutes",), ("get", "delete"))
GRPCROUTES: Rule = (("gateway.networking.k8s.io",), ("grpcroutes",), ("get", "delete"))
INFERENCEPOOLS: Rule = (("inference.networking.k8s.io",), ("inferencepools",), ("get", "delete"))
NODES: Rule = (("",), ("nodes",), ("get",))

#: The default features: every route kind the model chart renders (HTTPRoute, GRPCRoute,
#: InferencePool), recycling, lifecycle rules; no force delete.
ROUTES = [HTTPROUTES, GRPCROUTES, INFERENCEPOOLS]
DEFAULT_RULES = [
    MODELSERVICES_DELETE,
    STATUS,
    EVENTS,
    PODS_LIST,
    EVICTION,
    SERVICES,
    DEPLOYMENTS_PATCH,
    REPLICASETS,
    *ROUTES,
]


def rules(role: dict[str, Any]) -> list[Rule]:
    out = []
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule keys (resourceNames?): {rule}"
        out.append((tuple(rule["apiGroups"]), tuple(rule["resources"]), tuple(rule["verbs"])))
    return out


def render(helm: Helm, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return helm.template(values, chart=CONTROLLER_CHART)


def controller_args(docs: list[dict[str, Any]]) -> list[str]:
    container = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "controller"
    return container["args"]


def test_namespaced_install_has_a_role_and_nothing_cluster_scoped(helm: Helm) -> None:
    docs = render(helm)
    role = one(docs, "Role", CONTROLLER)
    assert role["metadata"] == {**role["metadata"], "name": CONTROLLER, "namespace": NAMESPACE}
    assert rules(role) == DEFAULT_RULES
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    args = controller_args(docs)
    assert flag(args, "--namespace") == NAMESPACE and "--all-namespaces" not in args
    assert "--no-node-reads" in args, "no ClusterRole for nodes: the controller must not read them"


def test_bindings_grant_the_role_to_the_controller_service_account_only(helm: Helm) -> None:
    docs = render(helm)
    sa = one(docs, "ServiceAccount")
    subject = [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    binding = one(docs, "RoleBinding", CONTROLLER)
    assert binding["subjects"] == subject
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER}
    lease_binding = one(docs, "RoleBinding", LEADER_ELECTION)
    assert lease_binding["subjects"] == subject
    assert lease_binding["roleRef"]["name"] == LEADER_ELECTION
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_all_namespaces_uses_one_cluster_role_with_node_reads(helm: Helm) -> None:
    docs = render(helm, {"watch": {"allNamespaces": True}})
    assert [r["metadata"]["name"] for r in find(docs, "Role") + find(docs, "RoleBinding")] == [LEADER_ELECTION] * 2
    cluster_role = one(docs, "ClusterRole")
    assert cluster_role["metadata"]["name"] == f"{NAMESPACE}-{CONTROLLER}"
    assert rules(cluster_role) == [*DEFAULT_RULES, NODES]
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]
    args = controller_args(docs)
    assert "--all-namespaces" in args and "--namespace" not in args and "--no-node-reads" not in args
    off = render(helm, {"watch": {"allNamespaces": True}, "features": {"nodeReads": False}})
    assert rules(one(off, "ClusterRole")) == DEFAULT_RULES
    assert "--no-node-reads" in controller_args(off)


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        pytest.param(
            {"forceDelete": True},
            [
                MODELSERVICES_DELETE,
                STATUS,
                EVENTS,
                PODS_DELETE,
                EVICTION,
                SERVICES,
                DEPLOYMENTS_PATCH,
                REPLICASETS,
                *ROUTES,
            ],
            id="force-delete-adds-pods-delete",
        ),
        pytest.param(
            {"inferencePools": False},
            [
                MODELSERVICES_DELETE,
                STATUS,
                EVENTS,
                PODS_LIST,
                EVICTION,
                SERVICES,
                DEPLOYMENTS_PATCH,
                REPLICASETS,
                HTTPROUTES,
                GRPCROUTES,
            ],
            id="no-inference-pools",
        ),
        pytest.param(
            {"grpcRoutes": False},
            [
                MODELSERVICES_DELETE,
                STATUS,
                EVENTS,
                PODS_LIST,
                EVICTION,
                SERVICES,
                DEPLOYMENTS_PATCH,
                REPLICASETS,
                HTTPROUTES,
                INFERENCEPOOLS,
            ],
            id="no-grpc-routes",
        ),
        pytest.param(
            {"recycling": False},
            [MODELSERVICES_DELETE, STATUS, EVENTS, PODS_LIST, SERVICES, DEPLOYMENTS_PATCH, REPLICASETS, *ROUTES],
            id="no-recycling-no-eviction",
        ),
        pytest.param(
            {"lifecycleRules": False},
            [MODELSERVICES_READ, STATUS, EVENTS, PODS_LIST, EVICTION, SERVICES, DEPLOYMENTS, REPLICASETS, *ROUTES],
            id="no-lifecycle-no-patch-no-self-delete",
        ),
        pytest.param(
            {
                "httpRoutes": False,
                "grpcRoutes": False,
                "inferencePools": False,
                "recycling": False,
                "lifecycleRules": False,
            },
            [MODELSERVICES_READ, STATUS, EVENTS, PODS_LIST, SERVICES, DEPLOYMENTS, REPLICASETS],
            id="minimal",
        ),
    ],
)
def test_rbac_verbs_follow_the_features(helm: Helm, features: dict[str, bool], expected: list[Rule]) -> None:
    assert rules(one(render(helm, {"features": features}), "Role", CONTROLLER)) == expected


def test_watch_namespaces_get_one_role_each(helm: Helm) -> None:
    docs = render(helm, values_sets.CONTROLLER_NAMESPACES)
    roles = find(docs, "Role", CONTROLLER)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    assert all(rules(r) == DEFAULT_RULES for r in roles)
    assert sorted(b["metadata"]["namespace"] for b in find(docs, "RoleBinding", CONTROLLER)) == ["a", "b"]
    assert one(docs, "Role", LEADER_ELECTION)["metadata"]["namespace"] == NAMESPACE, "the Lease: own namespace"
    assert controller_args(docs)[:5] == ["controller", "--namespace", "a", "--namespace", "b"]


def test_extra_rules_are_appended_only_when_asked(helm: Helm) -> None:
    extra = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "delete"]}
    docs = render(helm, {"rbac": {"extraRules": [extra]}})
    assert rules(one(docs, "Role", CONTROLLER)) == [*DEFAULT_RULES, (("",), ("configmaps",), ("get", "delete"))]


@pytest.mark.parametrize("values", values_sets.CONTROLLER_SETS)
def test_no_wildcards_or_secrets_anywhere(helm: Helm, values: dict[str, Any]) -> None:
    docs = render(helm, values)
    for role in find(docs, "Role") + find(docs, "ClusterRole"):
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule
            assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule.get("resourceNames", ()), *rule["verbs"]]
            assert "secrets" not in rule["resources"]


@pytest.mark.parametrize("values", values_sets.CONTROLLER_SETS)
def test_two_replicas_elect_a_leader_with_a_liveness_probe_on_healthz(helm: Helm, values: dict[str, Any]) -> None:
    """Two replicas, one acting: the Lease named after the release in the pod's own namespace (from
    the downward API), the holder identity from the pod name; only the Lease holder acts, so a
    rolling update may overlap old and new pods; a PDB and a preferred anti-affinity keep a standby
    on another node; the Lease Role grants get, create and update on leases and nothing else."""
    merged = values_sets.merged(values, values=values_sets.CONTROLLER_VALUES)
    docs = render(helm, values)
    dep = one(docs, "Deployment", CONTROLLER)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container, *extra = pod["containers"]
    assert container["name"] == "controller"
    assert extra == merged["extraContainers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert flag(container["args"], "--liveness-port") == str(ports["health"]) == str(merged["health"]["port"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert flag(container["args"], "--metrics-port") == str(merged["metricsPort"])
    assert ("metrics" in ports) == bool(merged["metricsPort"])
    args = container["args"]
    assert "--no-leader-election" not in args and flag(args, "--leader-election-lease") == CONTROLLER
    assert flag(args, "--leader-election-lease-duration") == "15"
    assert flag(args, "--leader-election-renew-deadline") == "10"
    assert flag(args, "--leader-election-retry-period") == "2"
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name"
    assert env["DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_NAMESPACE"] == "metadata.namespace"
    lease_role = one(docs, "Role", LEADER_ELECTION)
    assert lease_role["metadata"]["namespace"] == NAMESPACE and rules(lease_role) == [LEASES]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert one(docs, "PodDisruptionBudget", CONTROLLER)["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector},
    }
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }


def test_without_leader_election_one_replica_recreated(helm: Helm) -> None:
    """leaderElection.enabled false: --no-leader-election, one replica, Recreate (two pods would
    both act even during an upgrade), no Lease Role, no PDB, no anti-affinity; asking for two
    replicas then is refused."""
    docs = render(helm, {"leaderElection": {"enabled": False}, "replicas": 1})
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-election" in controller_args(docs) and "--leader-election-lease" not in controller_args(docs)
    assert not find(docs, "Role", LEADER_ELECTION) and not find(docs, "PodDisruptionBudget")
    assert "affinity" not in dep["spec"]["template"]["spec"]
    error = helm.template_error({"leaderElection": {"enabled": False}}, chart=CONTROLLER_CHART)
    assert "replicas=2 needs leaderElection.enabled" in error, error


def test_the_schema_refuses_bad_replicas_durations_and_unknown_features(helm: Helm) -> None:
    for values, expected in [
        ({"replicas": 0}, "replicas"),
        ({"leaderElection": {"leaseDuration": 1.5}}, "leaseDuration"),
        ({"leaderElection": {"retryPeriod": 0}}, "retryPeriod"),
        ({"leaderElection": {"peering": True}}, "peering"),
        ({"features": {"peering": True}}, "peering"),
        ({"watch": {"namespaces": ["Bad_NS"]}}, "/watch/namespaces/0"),
        ({"monitoring": {"serviceMonitor": {"interval": "30 s"}}}, "interval"),
    ]:
        error = helm.template_error(values, chart=CONTROLLER_CHART)
        assert "schema" in error and expected in error, error
    for values, expected in [
        (
            {"leaderElection": {"renewDeadline": 15}},
            "renewDeadline=15 must be less than leaderElection.leaseDuration=15",
        ),
        (
            {"leaderElection": {"retryPeriod": 6}},
            "renewDeadline=10 must be at least twice leaderElection.retryPeriod=6",
        ),
    ]:
        error = helm.template_error(values, chart=CONTROLLER_CHART)
        assert expected in error, error


def test_service_monitor_scrapes_the_metrics_port(helm: Helm) -> None:
    docs = render(helm, values_sets.CONTROLLER_CLUSTER)
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not find(render(helm), "ServiceMonitor"), "off by default"
    assert not find(render(helm, {**values_sets.CONTROLLER_CLUSTER, "metricsPort": 0}), "ServiceMonitor")
