"""The controller's RBAC is exactly what it calls. Broadening a rule fails here on purpose: change
EXPECTED_RULES only together with the controller code that needs the new permission."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import NAMESPACE, RELEASE, Helm, find, one

Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]

#: (apiGroups, resources, verbs) per namespace watched.
EXPECTED_RULES: list[Rule] = [
    (("drainrouter.dev",), ("modelservices",), ("get", "list", "watch", "patch", "delete")),
    (("drainrouter.dev",), ("modelservices/status",), ("get", "patch")),
    (("",), ("events",), ("create",)),
    (("",), ("pods",), ("list", "delete")),
    (("",), ("pods/eviction",), ("create",)),
    (("",), ("services",), ("get", "delete")),
    (("apps",), ("deployments",), ("get", "delete", "patch")),
    (("gateway.networking.k8s.io",), ("httproutes",), ("get", "delete")),
]
#: Cluster-scoped, needed even in namespaced mode.
EXPECTED_CLUSTER_RULES: list[Rule] = [(("",), ("nodes",), ("get",))]

CONTROLLER = f"{RELEASE}-drain-router-controller"


def rules(role: dict[str, Any]) -> list[Rule]:
    out = []
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule keys (resourceNames?): {rule}"
        out.append((tuple(rule["apiGroups"]), tuple(rule["resources"]), tuple(rule["verbs"])))
    return out


def test_namespaced_role_is_exactly_the_expected_rules(helm: Helm) -> None:
    docs = helm.template()
    role = one(docs, "Role")
    assert role["metadata"] == {**role["metadata"], "name": CONTROLLER, "namespace": NAMESPACE}
    assert rules(role) == EXPECTED_RULES
    nodes = one(docs, "ClusterRole")
    assert rules(nodes) == EXPECTED_CLUSTER_RULES
    assert nodes["metadata"]["name"] == f"{NAMESPACE}-{CONTROLLER}-nodes"


def test_bindings_grant_the_roles_to_the_controller_service_account_only(helm: Helm) -> None:
    docs = helm.template()
    sa = one(docs, "ServiceAccount")
    subject = [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    binding = one(docs, "RoleBinding")
    assert binding["subjects"] == subject
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER}
    cluster_binding = one(docs, "ClusterRoleBinding")
    assert cluster_binding["subjects"] == subject
    assert cluster_binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    controller = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]
    assert controller["serviceAccountName"] == sa["metadata"]["name"]
    # The model server pods get no API token at all.
    model = one(docs, "Deployment", f"{RELEASE}-drain-router")["spec"]["template"]["spec"]
    assert model["automountServiceAccountToken"] is False


def test_all_namespaces_uses_one_cluster_role_with_the_same_rules(helm: Helm) -> None:
    docs = helm.template({"controller": {"allNamespaces": True}})
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    assert rules(one(docs, "ClusterRole")) == EXPECTED_RULES + EXPECTED_CLUSTER_RULES
    args = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and "--namespace" not in args


def test_watch_namespaces_get_one_role_each(helm: Helm) -> None:
    docs = helm.template(values_sets.CONTROLLER_ONLY)
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    assert all(rules(r) == EXPECTED_RULES for r in roles)
    assert sorted(b["metadata"]["namespace"] for b in find(docs, "RoleBinding")) == ["a", "b"]
    args = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:5] == ["controller", "--namespace", "a", "--namespace", "b"]


def test_extra_rules_are_appended_only_when_asked(helm: Helm) -> None:
    extra = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "delete"]}
    docs = helm.template({"controller": {"rbac": {"extraRules": [extra]}}})
    assert rules(one(docs, "Role")) == [*EXPECTED_RULES, (("",), ("configmaps",), ("get", "delete"))]


@pytest.mark.parametrize("values", values_sets.ALL)
def test_no_wildcards_or_secrets_anywhere(helm: Helm, values: dict[str, Any]) -> None:
    for role in find(helm.template(values), "Role") + find(helm.template(values), "ClusterRole"):
        for groups, resources, verbs in rules(role):
            assert "*" not in groups + resources + verbs
            assert "secrets" not in resources


def test_controller_disabled_renders_no_controller_pieces(helm: Helm) -> None:
    docs = helm.template(values_sets.NO_CONTROLLER)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    assert len(find(docs, "Deployment")) == 1
