"""NetworkPolicy ingress, evaluated the way Kubernetes does, for the chart tests.

A connection from a source pod (its namespace and labels) to a port of a target pod is allowed when
no NetworkPolicy of the target's namespace selects the target for ingress, or when one rule of a
policy that does admits it: its ``ports`` match the port (a number, a number range with
``endPort``, or a name resolved against the target's container ports; ``protocol`` defaults to TCP;
no ``ports`` means every port), and one of its ``from`` peers matches the source (no ``from``, or an
empty one, means every source). A peer's ``podSelector`` alone means pods of the policy's namespace,
its ``namespaceSelector`` alone every pod of the namespaces it selects, both together the selected
pods of the selected namespaces. A namespace is matched on the one label every namespace carries,
``kubernetes.io/metadata.name``. ``ipBlock`` peers match no pod here: pod IPs are not known when
rendering, so an admission that relies on one is not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    container_ports: tuple[dict[str, Any], ...] = ()
    """The pod's containers' ``ports`` entries (for named ports)."""

    @classmethod
    def of(cls, workload: dict[str, Any], namespace: str) -> Pod:
        """The pod a rendered Deployment (or other pod-template workload) creates in ``namespace``."""
        template = workload["spec"]["template"]
        ports = tuple(p for c in template["spec"]["containers"] for p in c.get("ports", []))
        return cls(namespace=namespace, labels=dict(template["metadata"].get("labels", {})), container_ports=ports)


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions; empty selects everything)."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {op!r}")
    return True


def _namespace_labels(namespace: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace}


def _port_matches(entry: dict[str, Any], target: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    wanted = entry.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        named = [p for p in target.container_ports if p.get("name") == wanted and p.get("protocol", "TCP") == protocol]
        return any(p["containerPort"] == port for p in named)
    return wanted <= port <= entry.get("endPort", wanted)


def _peer_matches(peer: dict[str, Any], policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        namespace_ok = selects(peer["namespaceSelector"], _namespace_labels(source.namespace))
    else:
        namespace_ok = source.namespace == policy_namespace
    return namespace_ok and selects(peer.get("podSelector"), source.labels)


def _applies(policy: dict[str, Any], target: Pod) -> bool:
    namespace = policy["metadata"].get("namespace")
    types = policy["spec"].get("policyTypes") or ["Ingress"]
    return (
        namespace == target.namespace and "Ingress" in types and selects(policy["spec"]["podSelector"], target.labels)
    )


def ingress_allowed(
    policies: Iterable[dict[str, Any]], source: Pod, target: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Whether ``source`` may open a connection to ``port`` of ``target`` under ``policies`` (any
    documents: those that are not NetworkPolicies of the target's namespace are ignored)."""
    applying = [p for p in policies if p.get("kind") == "NetworkPolicy" and _applies(p, target)]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports") or []
            if ports and not any(_port_matches(entry, target, port, protocol) for entry in ports):
                continue
            peers = rule.get("from") or []
            if not peers or any(_peer_matches(peer, policy["metadata"]["namespace"], source) for peer in peers):
                return True
    return False
