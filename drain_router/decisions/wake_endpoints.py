"""The objects a sleeping ModelService's wake goes through, rendered and read back: the activator as
an endpoint of the model's Services (one EndpointSlice per Service), and the NetworkPolicy that
admits to the activator's ports only the clients the model's own policies admit. Purely
computational, no side effects: the controller reads, calls these, and writes what they return.

- **The slice** (:func:`render_slice`): in the model's namespace, named ``<service>-drain-router``,
  labelled ``kubernetes.io/service-name: <service>`` (so kube-proxy, gateways and meshes take its
  endpoints as the Service's), ``endpointslice.kubernetes.io/managed-by: drain-router.dev`` (the
  EndpointSlice controller leaves it alone) and ``drainrouter.dev/service: <modelservice>`` (the
  ownership rule), with an owner reference to the ModelService (the garbage collector removes it
  with the ModelService). Its endpoints are the activator pods that listen on the service's ports,
  ready; its ports are the Service's port names, each at the activator port assigned to the
  protocol the port speaks (:func:`protocol_of`). The user's Service is never written.
- **The state** (:func:`classify`, :func:`in_step`): whether every Service has its slice read
  back with a ready endpoint, and whether those endpoints are the ones that listen now.
- **The policy** (:func:`render_policy`, :func:`translate_peers`): in the activator's namespace,
  one per sleeping service, selecting the activator's pods on the service's ports, from the peers
  that the NetworkPolicies the ModelService owns admit to its pods, translated to where they now
  meet: a ``podSelector`` peer without a ``namespaceSelector`` (pods of the model's namespace) gets
  the model namespace's ``kubernetes.io/metadata.name``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drain_router.decisions import activation, activator, ownership, service_ports

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "drain-router.dev"
"""Not ``endpointslice-controller.k8s.io``: the EndpointSlice controller deletes or rewrites the slices
it manages, and leaves every other one alone."""
SLICE_SUFFIX = "-drain-router"
H2C = "kubernetes.io/h2c"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (immutable): how a policy in another namespace names one."""
POLICY_PREFIX = "drain-router-"
MAX_NAME = 63

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SERVICE = re.compile(rf"(?P<namespace>{_LABEL})/(?P<name>{_LABEL})(?P<suffix>:.*)?")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivatorService:
    """The activator's Service (``--activator-service <namespace>/<name>``): its EndpointSlices give
    the activator's pods, its namespace holds the port map and the NetworkPolicies."""

    namespace: str
    name: str
    ignored_suffix: str | None = None
    """A ``:<port>[,<grpcPort>]`` given after the name (the syntax before the ports were assigned per
    service): accepted so an upgrade of the image ahead of its chart keeps running, and ignored
    (the command logs that it is deprecated)."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def configmap(self) -> str:
        return service_ports.configmap_name(self.name)


def parse_activator_service(text: str) -> ActivatorService:
    """``<namespace>/<name>`` (DNS-1123 labels), optionally followed by the old ``:<port>[,<grpcPort>]``
    (kept in :attr:`ActivatorService.ignored_suffix`, checked for form only); ``ValueError`` saying
    what is wrong otherwise."""
    match = _SERVICE.fullmatch(text.strip())
    suffix = None if match is None else match["suffix"]
    if match is None or (suffix is not None and not re.fullmatch(r":[0-9]{1,5}(?:,[0-9]{1,5})?", suffix)):
        raise ValueError(
            f"{text!r} is not <namespace>/<name> (namespace and name DNS-1123 labels, e.g. "
            "drain-router/drain-router-activator)"
        )
    return ActivatorService(namespace=match["namespace"], name=match["name"], ignored_suffix=suffix)


# --- the slice ----------------------------------------------------------------------------------------


def protocol_of(port: Mapping[str, Any]) -> str:
    """What a Service port speaks: ``grpc`` (h2c) for ``appProtocol: kubernetes.io/h2c`` or a port
    named ``grpc`` or ``grpc-*``; ``http`` (HTTP/1.1, WebSocket) otherwise."""
    name = str(port.get("name") or "")
    if port.get("appProtocol") == H2C or name == "grpc" or name.startswith("grpc-"):
        return service_ports.GRPC
    return service_ports.HTTP


def tcp_ports(service: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        p
        for p in (service.get("spec") or {}).get("ports") or ()
        if isinstance(p, Mapping) and (p.get("protocol") or "TCP") == "TCP"
    ]


def wanted(namespace: str, name: str, services: Iterable[Mapping[str, Any]]) -> tuple[service_ports.Assignment, ...]:
    """The ports the ModelService ``namespace/name`` needs of the activator: one per protocol its
    Services' TCP ports speak."""
    protocols = sorted({protocol_of(p) for s in services for p in tcp_ports(s)})
    return tuple(service_ports.Assignment(namespace, name, protocol) for protocol in protocols)


def slice_name(service: str) -> str:
    return f"{service}{SLICE_SUFFIX}"


def selector(owner: str) -> str:
    """The label selector of a ModelService's slices."""
    return f"{ownership.SERVICE_LABEL}={owner},{MANAGED_BY_LABEL}={MANAGED_BY}"


def render_slice(
    *,
    owner: ownership.Owner,
    api_version: str,
    service: Mapping[str, Any],
    assigned: Mapping[str, int],
    addresses: Sequence[str],
) -> dict[str, Any]:
    """The EndpointSlice that makes ``addresses`` (the activator pods that listen) the ready endpoints
    of ``service``, each of its TCP ports at the activator port ``assigned`` to its protocol. Its
    address type is the Service's (first) IP family; an address of the other family is left out (on
    a dual-stack cluster whose activator pods' primary IPs are not of that family the slice has no
    endpoint, and the service is never put to sleep)."""
    name = str((service.get("metadata") or {}).get("name") or "")
    family = address_type(service)
    ports = [
        {
            "name": p.get("name") or "",
            "protocol": "TCP",
            "port": assigned[protocol_of(p)],
            **({"appProtocol": p["appProtocol"]} if p.get("appProtocol") else {}),
        }
        for p in tcp_ports(service)
        if protocol_of(p) in assigned
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(name),
            "namespace": owner.namespace,
            "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY, ownership.SERVICE_LABEL: owner.name},
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": ownership.KIND,
                    "name": owner.name,
                    "uid": owner.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "addressType": family,
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": True, "serving": True, "terminating": False}}
            for ip in sorted(addresses)
            if _family(ip) == family
        ],
        "ports": ports,
    }


def address_type(service: Mapping[str, Any]) -> str:
    """The ``addressType`` of a slice for ``service``: its first ``spec.ipFamilies`` (``IPv4`` when
    it names none, as a Service read from an older API server may)."""
    families = (service.get("spec") or {}).get("ipFamilies") or ["IPv4"]
    return "IPv6" if families[0] == "IPv6" else "IPv4"


def _family(address: str) -> str | None:
    try:
        return f"IPv{ipaddress.ip_address(address).version}"
    except ValueError:
        return None


def ready_addresses(slices: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The addresses of the ready (and not terminating) endpoints of ``slices``, sorted, once each.
    A ``ready`` left unset counts as ready, as the API documents it."""
    out: set[str] = set()
    for s in slices:
        for endpoint in s.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            out.update(str(a) for a in endpoint.get("addresses") or ())
    return tuple(sorted(out))


def classify(services: Sequence[str], slices: Sequence[Mapping[str, Any]]) -> activation.Endpoints:
    """Where the activator stands on the Services named ``services`` (the ModelService's own), from
    its slices as read: :attr:`~activation.Endpoints.ACTIVATOR` when each has its slice with a ready
    endpoint; :attr:`~activation.Endpoints.NO_SERVICE` without a Service (and no slice);
    :attr:`~activation.Endpoints.NONE` without a slice; :attr:`~activation.Endpoints.PARTIAL`
    otherwise."""
    by_name = {str((s.get("metadata") or {}).get("name")): s for s in slices}
    if not services:
        return activation.Endpoints.PARTIAL if slices else activation.Endpoints.NO_SERVICE
    if not slices:
        return activation.Endpoints.NONE
    if all(slice_name(name) in by_name and ready_addresses([by_name[slice_name(name)]]) for name in services):
        return activation.Endpoints.ACTIVATOR
    return activation.Endpoints.PARTIAL


def in_step(stored: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether a slice as read already has ``desired``'s endpoints and ports (labels and owner are
    set at creation and never change)."""
    if stored is None:
        return False
    return ready_addresses([stored]) == ready_addresses([desired]) and _ports(stored) == _ports(desired)


def _ports(s: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    return sorted(
        (str(p.get("name") or ""), int(p.get("port") or 0), str(p.get("appProtocol") or ""))
        for p in s.get("ports") or ()
    )


def slice_patch(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that gives ``stored`` ``desired``'s endpoints and ports (lists replace)."""
    return {"endpoints": desired["endpoints"], "ports": desired["ports"]}


# --- the activator's /admin/ports ---------------------------------------------------------------------


def parse_listening(body: Any) -> dict[int, service_ports.Assignment] | None:
    """``GET /admin/ports``' body, ``{"ports": {"20000": "team-a/llama/http", ...}}`` -> the ports the
    activator pod listens on; ``None`` when it is not that shape (the pod then counts as listening
    on nothing: it fails closed)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("ports"), Mapping):
        return None
    table = {}
    for key, value in body["ports"].items():
        port, assignment = service_ports.parse_port(key), service_ports.parse_entry(value)
        if port is None or assignment is None:
            return None
        table[port] = assignment
    return table


def listens(
    listening: Mapping[int, service_ports.Assignment] | None, assigned: Mapping[int, service_ports.Assignment]
) -> bool:
    """An activator pod may be an endpoint when it listens on every one of the service's ports
    (``assigned``), for the same assignment."""
    return listening is not None and bool(assigned) and all(listening.get(p) == a for p, a in assigned.items())


# --- the NetworkPolicy ----------------------------------------------------------------------------------


def policy_name(namespace: str, service: str) -> str:
    """``drain-router-<namespace>-<service>``, or, past 63 characters, its start and a hash of the
    whole (two services never share a name)."""
    name = f"{POLICY_PREFIX}{namespace}-{service}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('-')}-{digest}"


def _matches(label_selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    label_selector = label_selector or {}
    if any(labels.get(k) != v for k, v in (label_selector.get("matchLabels") or {}).items()):
        return False
    for expr in label_selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or ())
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def selects_ingress(policy: Mapping[str, Any], pod_labels: Mapping[str, str]) -> bool:
    """Whether ``policy`` restricts ingress to pods labelled ``pod_labels`` (the ModelService's
    ``podSelector.matchLabels``, which its pods carry): its podSelector matches them and its
    ``policyTypes`` include Ingress (absent: Ingress)."""
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes") or ["Ingress"]
    return "Ingress" in types and _matches(spec.get("podSelector"), pod_labels)


def target_ports(services: Iterable[Mapping[str, Any]], spec: Mapping[str, Any]) -> frozenset[int | str]:
    """Where the Services send their clients on the pods: each TCP port's ``targetPort`` (a number
    or a container port's name; absent: the port's number), and the router's traffic ports by number
    (``spec.router.port`` and ``grpcPort``), which a named ``targetPort`` stands for (the pods'
    container ports are not read: a sleeping service has none)."""
    out: set[int | str] = {activator.router_port(spec)}
    grpc = activator.router_grpc_port(spec)
    if grpc is not None:
        out.add(grpc)
    for service in services:
        for port in tcp_ports(service):
            target = port.get("targetPort", port.get("port"))
            if isinstance(target, int | str) and not isinstance(target, bool):
                out.add(target)
    return frozenset(out)


def covers(rule: Mapping[str, Any], targets: frozenset[int | str]) -> bool:
    """Whether an ingress ``rule`` admits its sources to one of ``targets`` (the Services' target
    ports): a rule without ``ports`` covers every port; a TCP port entry covers a target equal to its
    ``port`` (number or name), or within ``port``..``endPort``; an entry without ``port`` covers every
    port of its protocol."""
    entries = rule.get("ports")
    if not entries:
        return True
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("protocol", "TCP") != "TCP":
            continue
        port = entry.get("port")
        if port is None or port in targets:
            return True
        end = entry.get("endPort")
        if not (isinstance(port, int) and isinstance(end, int)):
            continue
        if any(isinstance(t, int) and port <= t <= end for t in targets):
            return True
    return False


def translate_peers(
    policies: Iterable[Mapping[str, Any]],
    namespace: str,
    pod_labels: Mapping[str, str],
    targets: frozenset[int | str] | None = None,
) -> list[dict[str, Any]] | None:
    """The ``from`` peers the model's own policies (``policies``: those the ModelService owns in
    ``namespace``) admit to its pods on the Services' target ports (``targets``; ``None``: every
    port), as seen from the activator's namespace. ``None``: admit every source (no policy selects
    the pods, or one of their rules covering those ports has no ``from``); a list (possibly empty:
    admit nothing) otherwise. Rules for other ports (a router's admin port) give nothing: what a
    client may reach through the activator is what it may reach through the Service. A
    ``podSelector`` peer without a ``namespaceSelector`` gets the model's namespace by name;
    ``ipBlock`` and ``namespaceSelector`` peers are kept as they are."""
    selecting = [p for p in policies if selects_ingress(p, pod_labels)]
    if not selecting:
        return None
    peers: list[dict[str, Any]] = []
    for policy in selecting:
        for rule in (policy.get("spec") or {}).get("ingress") or ():
            if not isinstance(rule, Mapping) or (targets is not None and not covers(rule, targets)):
                continue
            sources = rule.get("from")
            if not sources:
                return None  # a rule without sources admits every source
            for peer in sources:
                translated = _translate(peer, namespace)
                if translated not in peers:
                    peers.append(translated)
    return peers


def _translate(peer: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    out = dict(peer)
    if "podSelector" in out and "namespaceSelector" not in out:
        out["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}
    return out


def render_policy(
    *,
    activator: ActivatorService,
    activator_selector: Mapping[str, str],
    owner: ownership.Owner,
    peers: list[dict[str, Any]] | None,
    ports: Iterable[int],
) -> dict[str, Any]:
    """The NetworkPolicy admitting ``peers`` (``None``: every source) to the activator's pods
    (``activator_selector``: its Service's selector) on the service's activator ``ports``."""
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": p} for p in sorted(ports)]}
    if peers is not None:
        rule["from"] = peers
    # An empty ``from`` would admit every source: admitting none is no rule at all.
    ingress = [] if peers == [] else [rule]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(owner.namespace, owner.name),
            "namespace": activator.namespace,
            "labels": {ownership.SERVICE_LABEL: owner.name, MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {"drainrouter.dev/model-service": f"{owner.namespace}/{owner.name}"},
        },
        "spec": {
            "podSelector": {"matchLabels": dict(activator_selector)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
