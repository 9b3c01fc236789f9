"""RBAC both ways, read from the API server's audit log (every request of the session, its user,
verb and object, at level Metadata), after every other scenario of the session (``after_all``):

- no request of a chart's ServiceAccount (the controller chart's in its namespace, the model charts'
  in theirs) was refused with a 403: a rule the product needs is missing;
- every (resource[/subresource], verb) the controller chart's Roles and ClusterRoles grant, read from
  the API server, was used by an allowed request of the ServiceAccount it is bound to: an unused
  grant is a rule to remove, or a scenario to add;
- the controller and the activator call the API server as their own chart's ServiceAccount, with
  the token bound to their pod, never as an administrator.

Run alone, or with only some scenarios, the second check finds the grants only the missing scenarios
use (deletion, recycling, waking, high availability): it is meant for the whole of e2e/kubernetes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import re
from pathlib import Path

import aiohttp
import pytest

from drain_router.decisions import service_ports
from drain_router_dev.kube.control_plane import BRIDGE, Cluster
from e2e.kubernetes.audit import AuditLog, Call, service_account
from e2e.kubernetes.conftest import CONTROLLER_NAMESPACE, CONTROLLER_RELEASE, MODEL_NAMESPACES
from e2e.kubernetes.kube import Kube

#: The namespaces whose ServiceAccounts are the charts' (the controller's and the model releases').
CHART_NAMESPACES = (CONTROLLER_NAMESPACE, *MODEL_NAMESPACES)
INSTANCE = f"app.kubernetes.io/instance={CONTROLLER_RELEASE}"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
#: The activator's Service, its port map, its admin port, and the default range of its ports.
ACTIVATOR = f"{CONTROLLER_RELEASE}-drain-router-controller-activator"
PORT_MAP = service_ports.configmap_name(ACTIVATOR)
ACTIVATOR_ADMIN_PORT = 9091
FIRST_PORTS = (20000, 21000)
pytestmark = [pytest.mark.after_all, pytest.mark.timeout(300, func_only=True)]


def line(request: Call) -> str:
    return f"{request.code} {request.user} {request.verb} {request.group or 'core'}/{request.rule_resource} ({request.uri[:160]})"


def read_audit(log: Path) -> list[Call]:
    """Every request of the session the log has reached a response for (a watch still open too)."""
    return AuditLog(log, whole=True).requests()


def is_chart_account(user: str) -> bool:
    return any(user.startswith(service_account(ns, "")) for ns in CHART_NAMESPACES)


@dataclasses.dataclass(frozen=True)
class Grant:
    """One verb on one resource of one API group, granted to ``user`` by ``role`` (in
    ``namespace`` only, for a RoleBinding; everywhere for a ClusterRoleBinding)."""

    user: str
    group: str
    resource: str
    verb: str
    namespace: str | None
    role: str
    names: tuple[str, ...] = ()
    """The rule's ``resourceNames``: only these objects (empty: any)."""

    def used_by(self, request: Call) -> bool:
        return (
            request.decision == "allow"
            and (request.user, request.group, request.rule_resource, request.verb)
            == (self.user, self.group, self.resource, self.verb)
            and (self.namespace is None or request.namespace == self.namespace)
            and (not self.names or request.name in self.names)
        )

    def line(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        names = f" {','.join(self.names)}" if self.names else ""
        return (
            f"{self.user.rsplit(':', 1)[1]}: {self.verb} {self.group or 'core'}/{self.resource}{names}{where} "
            f"({self.role})"
        )


async def granted(kube: Kube) -> list[Grant]:
    """What the controller chart's bindings grant, as the API server stores its roles."""
    grants: list[Grant] = []
    for kind in ("clusterrolebindings", "rolebindings"):
        _, bindings = await kube.api.request("GET", f"{RBAC}/{kind}?labelSelector={INSTANCE}")
        for binding in bindings["items"]:
            namespace = binding["metadata"].get("namespace")
            ref = binding["roleRef"]
            where = f"{RBAC}/namespaces/{namespace}/roles" if ref["kind"] == "Role" else f"{RBAC}/clusterroles"
            _, role = await kube.api.request("GET", f"{where}/{ref['name']}")
            users = [
                service_account(s["namespace"], s["name"])
                for s in binding.get("subjects") or ()
                if s["kind"] == "ServiceAccount"
            ]
            for user in users:
                for rule in role.get("rules") or ():
                    assert not rule.get("nonResourceURLs"), rule
                    names = tuple(rule.get("resourceNames") or ())
                    for group in rule["apiGroups"]:
                        for resource in rule["resources"]:
                            for verb in rule["verbs"]:
                                label = f"{ref['kind']} {ref['name']}"
                                grants.append(Grant(user, group, resource, verb, namespace, label, names))
    return grants


async def component_accounts(kube: Kube) -> dict[str, str]:
    """The controller chart's Deployments (by name) and the ServiceAccount user each runs as."""
    _, found = await kube.api.request(
        "GET", f"/apis/apps/v1/namespaces/{CONTROLLER_NAMESPACE}/deployments?labelSelector={INSTANCE}"
    )
    return {
        d["metadata"]["name"]: service_account(
            CONTROLLER_NAMESPACE, d["spec"]["template"]["spec"].get("serviceAccountName") or "default"
        )
        for d in found["items"]
    }


def pod_of(deployment: str, pod: str) -> bool:
    """``pod`` is one a ReplicaSet of ``deployment`` made (``<deployment>-<hash>-<suffix>``)."""
    return re.fullmatch(rf"{re.escape(deployment)}-[a-z0-9]+-[a-z0-9]+", pod) is not None


def from_pod_network(request: Call) -> bool:
    try:
        address = ipaddress.ip_address(request.source)
    except ValueError:
        return False
    return address in BRIDGE.subnet and str(address) != BRIDGE.gateway


async def refused_on_a_port_of_no_service(kube: Kube) -> tuple[int, dict[str, str]]:
    """A ready activator pod's ``/admin/ports`` lists exactly the port map's ports (once its poll has
    read the map's last change); a connection to it on a port of the range that the map assigns to
    no service is refused by the kernel (nothing listens), so it costs the activator nothing and
    reaches no API call, whatever the client sends. The port tried, and the ports listed."""
    pods = await kube.ready_pods(CONTROLLER_NAMESPACE, f"{INSTANCE},app.kubernetes.io/component=activator")
    assert pods, "no ready activator pod"
    address = pods[0]["status"]["podIP"]

    async def listed() -> tuple[dict[str, str]] | None:  # (an empty map is an answer too)
        found = await kube.get("ConfigMap", CONTROLLER_NAMESPACE, PORT_MAP)
        assigned = {int(p) for p in ((found or {}).get("data") or {})}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}:{ACTIVATOR_ADMIN_PORT}/admin/ports") as resp:
                ports: dict[str, str] = (await resp.json())["ports"]
        return (ports,) if {int(p) for p in ports} == assigned else None

    (ports,) = await kube.wait("the activator listening on the map's ports, and no other", listed)
    port = next(p for p in range(*FIRST_PORTS) if str(p) not in ports)
    with pytest.raises(ConnectionRefusedError):
        _, writer = await asyncio.open_connection(address, port)
        writer.close()
    return port, ports


async def test_each_component_calls_the_api_as_its_own_service_account(kube: Kube, installed: Cluster) -> None:
    """Every request from a controller or activator pod is by that chart's ServiceAccount, with a
    token bound to that pod; every request by those accounts comes from their pods; nothing from
    the pod network calls as an administrator, or fails to authenticate."""
    accounts = await component_accounts(kube)
    assert len(accounts) == 2 and len(set(accounts.values())) == 2, accounts
    await refused_on_a_port_of_no_service(kube)

    async def each_component_seen() -> list[Call] | None:
        requests = read_audit(installed.audit_log)
        seen = {d for d in accounts for r in requests if pod_of(d, r.pod)}
        return requests if seen == set(accounts) else None

    requests = await kube.wait("a request from a pod of each component in the audit log", each_component_seen)
    for deployment, user in accounts.items():
        from_its_pods = [r for r in requests if pod_of(deployment, r.pod)]
        assert {r.user for r in from_its_pods} == {user}, deployment
        strays = [line(r) for r in requests if r.user == user and not pod_of(deployment, r.pod)]
        assert not strays, f"{user} used outside the pods of {deployment}: {strays[:10]}"
    from_pods = [r for r in requests if from_pod_network(r)]
    admins = [line(r) for r in from_pods if not (r.user.startswith("system:serviceaccount:") and r.pod)]
    assert not admins, f"calls from pods, not as a pod's ServiceAccount: {admins[:10]}"
    unauthenticated = [line(r) for r in from_pods if r.code == 401]
    assert not unauthenticated, unauthenticated[:10]


def test_no_chart_service_account_was_forbidden(installed: Cluster, report: list[str]) -> None:
    """A 403 to a chart's ServiceAccount anywhere in the session is a rule the product lacks."""
    requests = [r for r in read_audit(installed.audit_log) if is_chart_account(r.user)]
    forbidden = [line(r) for r in requests if r.code == 403 or r.decision == "forbid"]
    report.append(f"{len(requests)} requests by the charts' ServiceAccounts, {len(forbidden)} forbidden")
    assert not forbidden, "refused (a missing RBAC rule):\n" + "\n".join(forbidden)


async def test_every_granted_rule_was_used(kube: Kube, installed: Cluster, report: list[str]) -> None:
    """Each grant of the controller chart's roles, used by at least one allowed request of its
    ServiceAccount during the session."""
    grants = await granted(kube)
    assert grants, "the controller chart's roles were not found"
    requests = read_audit(installed.audit_log)
    uses = {g: sum(1 for r in requests if g.used_by(r)) for g in grants}
    table = [f"{'used' if n else 'UNUSED'} {n:6d}  {g.line()}" for g, n in uses.items()]
    print("\n".join(table))
    report.extend(table)
    unused = [g.line() for g, n in uses.items() if not n]
    assert not unused, (
        f"{len(unused)} of {len(grants)} grants unused this session: each is a rule to remove, or a scenario "
        "to add (run with every scenario of e2e/kubernetes: alone, the grants only other scenarios use are "
        "unused):\n" + "\n".join(unused)
    )
