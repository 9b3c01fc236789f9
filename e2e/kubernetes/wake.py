"""The wake scenarios' reading of what the API server and the data plane held (``test_wake.py``),
pure so that it is tested on its own (tests/tools/test_wake_e2e.py): the model Service's
EndpointSlices (the EndpointSlice controller's, and the activator's slice of drain-router's), the
user's objects compared version to version, the audit log's writes to them, kube-proxy's DNAT rules,
and the invariants of a sleep and a wake replayed from the watches (:class:`Wake`).
"""

from __future__ import annotations

import dataclasses
import re

from e2e.kubernetes.audit import WRITES, Call
from e2e.kubernetes.history import History
from e2e.kubernetes.kube import Json, is_ready

SLICE_SUFFIX = "-drain-router"
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
OURS = "drain-router.dev"
USERS_OBJECTS = frozenset({"httproutes", "grpcroutes", "services", "referencegrants"})
"""What the controller and the activator never write: the user's routes, Services and grants."""


def protocol_of(port: Json) -> str:
    """What a Service port speaks, as the controller reads it: ``grpc`` for ``appProtocol:
    kubernetes.io/h2c`` or a name ``grpc``/``grpc-*``, else ``http``."""
    name = str(port.get("name") or "")
    grpc = port.get("appProtocol") == "kubernetes.io/h2c" or name == "grpc" or name.startswith("grpc-")
    return "grpc" if grpc else "http"


def slices_of(slices: list[Json], service: str, *, ours: bool | None = None) -> list[Json]:
    """``service``'s EndpointSlices: the activator's (``ours``), the EndpointSlice controller's (not
    ``ours``), or both (``None``)."""
    return [
        item
        for item in slices
        if item["metadata"].get("labels", {}).get(SERVICE_NAME) == service
        and (ours is None or (item["metadata"]["labels"].get(MANAGED_BY) == OURS) == ours)
    ]


def ready_addresses(slices: list[Json], service: str, *, ours: bool | None = None) -> set[str]:
    """The ready endpoints' addresses of ``service``'s EndpointSlices (see :func:`slices_of`)."""
    return {
        address
        for item in slices_of(slices, service, ours=ours)
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready")
        for address in endpoint.get("addresses", [])
    }


def ready_pod(held: dict[tuple[str, str], Json], instance: str) -> bool:
    return any(
        kind == "Pod"
        and obj["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == instance
        and is_ready(obj)
        for (kind, _), obj in held.items()
    )


def same_object(before: Json, after: Json) -> bool:
    """The same version, and the same content, of a user's object."""
    keep = ("resourceVersion", "generation", "labels", "annotations", "ownerReferences", "finalizers")
    return bool(
        {k: before["metadata"].get(k) for k in keep} == {k: after["metadata"].get(k) for k in keep}
        and before.get("spec") == after.get("spec")
    )


def writes_to_users_objects(calls: list[Call], users: tuple[str, ...]) -> list[str]:
    """``users``' writes to any route, Service or ReferenceGrant."""
    return [str(c) for c in calls if c.user in users and c.verb in WRITES and c.resource in USERS_OBJECTS]


@dataclasses.dataclass(frozen=True)
class Wake:
    """Everything the scenario says about the user's objects and the model Service's endpoints. The
    user's route and Service are never written; while the service sleeps the activator is an
    endpoint of the Service through a slice of its own, on the port the port map assigns."""

    namespace: str
    service: str
    """The model Service's (and the ModelService's, the release's Deployment's) name."""
    instance: str
    """The release: its pods' ``app.kubernetes.io/instance``."""
    originals: dict[str, Json]
    """The user's objects (``Service``, ``HTTPRoute`` when there is one) as read at install."""

    @property
    def slice_name(self) -> str:
        return f"{self.service}{SLICE_SUFFIX}"

    def check_unchanged(self, now: dict[str, Json | None]) -> None:
        for kind, before in self.originals.items():
            after = now[kind]
            assert after is not None, f"the {kind} is gone"
            assert same_object(before, after), (kind, before["metadata"], after["metadata"], after.get("spec"))

    def check_asleep(self, slices: list[Json], service: Json, ports: dict[str, int], activators: set[str]) -> None:
        """The Service's own slices empty; the activator's slice, as the API server holds it: the
        Service's name and drain-router as its manager, owned by the ModelService, every activator
        pod a ready endpoint, each Service port at the activator port assigned to its protocol."""
        assert not ready_addresses(slices, self.service, ours=False), slices_of(slices, self.service, ours=False)
        (ours,) = slices_of(slices, self.service, ours=True)
        meta = ours["metadata"]
        assert meta["name"] == self.slice_name and meta["labels"]["drainrouter.dev/service"] == self.service, meta
        assert [(r["kind"], r["name"]) for r in meta["ownerReferences"]] == [("ModelService", self.service)], meta
        assert ready_addresses([ours], self.service) == activators, (ours, activators)
        wanted = {(p["name"], ports[protocol_of(p)]) for p in service["spec"]["ports"]}
        assert {(p["name"], p["port"]) for p in ours["ports"]} == wanted, (ours["ports"], wanted)

    def check_history(self, history: History) -> str:
        """From install to the end, at every write the API server held: the Service has a ready
        endpoint (a pod's or the activator's); the Deployment is at 0 only while the activator's slice
        has a ready endpoint; that slice is deleted only once a model pod is Ready; neither the route
        nor the Service has a version other than the one installed. For the report: the margins
        (activator slice ready -> scale to 0, first pod Ready -> slice deleted), the shortest time
        the Service had a ready endpoint of each kind around each switch, as the watches delivered
        them."""
        for kind in self.originals:
            versions = {v["metadata"]["resourceVersion"] for v in history.versions(kind, self.service)}
            installed = self.originals[kind]["metadata"]["resourceVersion"]
            assert versions == {installed}, f"the {kind} was written: {sorted(versions)}, installed {installed}"
        moments: dict[str, float] = {}
        steps = 0
        for change, held in history.states():
            steps += 1
            slices = [obj for (kind, _), obj in held.items() if kind == "EndpointSlice"]
            deployment = held.get(("Deployment", self.service))
            at = f"at version {change.version} ({change.kind}/{change.name}{', deleted' if change.deleted else ''})"
            activator = ready_addresses(slices, self.service, ours=True)
            pods = ready_addresses(slices, self.service, ours=False)
            assert activator or pods, f"{at} the Service {self.service} had no ready endpoint"
            if activator:
                moments.setdefault("activator ready", change.seen)
            if deployment is not None and deployment["spec"]["replicas"] == 0:
                assert activator, f"{at} the Deployment was at 0 with no ready activator endpoint"
                moments.setdefault("scaled to 0", change.seen)
            if "scaled to 0" in moments and not pods:
                moments.setdefault("pods gone", change.seen)
            if "scaled to 0" in moments and not ready_pod(held, self.instance):
                moments.setdefault("no pod ready", change.seen)
            if "no pod ready" in moments and ready_pod(held, self.instance):
                moments.setdefault("pod ready", change.seen)
            if "pods gone" in moments and pods:
                moments.setdefault("pod endpoint", change.seen)
            if change.kind == "EndpointSlice" and change.name == self.slice_name and change.deleted:
                assert ready_pod(held, self.instance) and pods, f"{at} the activator's slice went before a ready pod"
                moments.setdefault("slice deleted", change.seen)
        missing = {"activator ready", "scaled to 0", "pods gone", "pod ready", "pod endpoint", "slice deleted"} - set(
            moments
        )
        assert not missing, (missing, moments)
        return (
            f"{steps} writes replayed, never without a ready endpoint; scaled to 0 "
            f"{moments['scaled to 0'] - moments['activator ready']:.2f} s after the activator's slice was ready; "
            f"its slice deleted {moments['slice deleted'] - moments['pod ready']:.2f} s after the first pod was "
            f"Ready ({moments['slice deleted'] - moments['pod endpoint']:.2f} s after the Service's own slice "
            "had it ready)"
        )


def kube_proxy_destinations(iptables_save: str, namespace: str, service: str, port: str) -> set[tuple[str, int]]:
    """Pure: where kube-proxy's rules (``iptables-save -t nat``) DNAT connections to the Service's
    ``port`` (its name): each endpoint's ``KUBE-SEP`` chain ends in ``-j DNAT --to-destination``."""
    comment = re.escape(f"{namespace}/{service}:{port}")
    found: set[tuple[str, int]] = set()
    for line in iptables_save.splitlines():
        if not line.startswith("-A KUBE-SEP-"):
            continue
        match = re.search(rf'--comment "?{comment}"? .*-j DNAT .*--to-destination ([\d.]+):(\d+)', line)
        if match:
            found.add((match[1], int(match[2])))
    return found


__all__ = [
    "Wake",
    "kube_proxy_destinations",
    "protocol_of",
    "ready_addresses",
    "ready_pod",
    "same_object",
    "slices_of",
    "writes_to_users_objects",
]
