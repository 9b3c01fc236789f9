"""An independent check of the ownership rule on every write the controller sends to the emulator.

Written apart from the product's own rule (:mod:`drain_router.decisions.ownership`), from the rule as
the docs state it: the controller deletes, scales, patches, evicts or force-deletes an object only
when the object, as stored when the write arrives, says it belongs to a ModelService of its
namespace (the label ``drainrouter.dev/service`` with its name, or an owner reference to it); a pod
only through its controller, a ReplicaSet whose controller is a Deployment that says so; and it
creates (the activator's EndpointSlices) only objects that say so from the start. The ModelServices
themselves (status, deletion), events and Leases are the controller's own, and so, in the activator's
namespace (:data:`ACTIVATOR_NAMESPACE`) only, the port map ConfigMap and the NetworkPolicies.

Every controller test's emulator carries one (:func:`install`), and its fixture fails the test on any
violation at the end; the tests that call the API client directly with made-up consents opt out.
"""

from __future__ import annotations

from typing import Any

import kmock

from .emulator import TEST_CLIENT, ClusterEmulator

LABEL = "drainrouter.dev/service"
OWN = {"modelservices", "events", "leases"}
ACTIVATOR_NAMESPACE = "gw"
OWN_IN_ACTIVATOR_NAMESPACE = {"configmaps", "networkpolicies"}
PATHS = {
    "pods": "v1/pods",
    "services": "v1/services",
    "deployments": "apps/v1/deployments",
    "replicasets": "apps/v1/replicasets",
    "httproutes": "gateway.networking.k8s.io/v1/httproutes",
    "endpointslices": "discovery.k8s.io/v1/endpointslices",
    "inferencepools": "inference.networking.k8s.io/v1/inferencepools",
}


class OwnershipAudit:
    def __init__(self, emulator: ClusterEmulator, msvc_path: str) -> None:
        self.emulator = emulator
        self.msvc_path = msvc_path
        self.violations: list[str] = []
        self.writes = 0

    def __call__(self, request: Any) -> None:
        if request.resource is None or request.headers.get("User-Agent", "").startswith(TEST_CLIENT):
            return
        plural = request.resource.plural
        method = str(getattr(request.method, "value", request.method))
        if plural in OWN or (plural in OWN_IN_ACTIVATOR_NAMESPACE and request.namespace == ACTIVATOR_NAMESPACE):
            return
        if method == "POST" and request.subresource is None and plural not in ("events",):
            self.writes += 1
            body = request.data if isinstance(request.data, dict) else {}
            if plural != "endpointslices" or not self._says_so(body, request.namespace):
                self.violations.append(f"POST {plural} in {request.namespace}: created without saying whose")
            return
        write = method in ("DELETE", "PATCH", "PUT") or (method == "POST" and request.subresource == "eviction")
        if not write or not request.name:
            return
        self.writes += 1
        path = PATHS.get(plural)
        if path is None:
            self.violations.append(f"{method} {plural}/{request.name}: a kind the controller never writes")
            return
        stored = self.emulator.get(path, request.namespace, request.name)
        if stored is None:
            return  # nothing there to write (answered 404)
        if not self._belongs(plural, stored, request.namespace):
            self.violations.append(f"{method} {plural}/{request.name} in {request.namespace}: not owned")

    def _services(self, namespace: str) -> dict[str, str]:
        """name -> uid of the ModelServices of ``namespace``."""
        resource = kmock.resource(self.msvc_path)
        return {
            obj.raw["metadata"]["name"]: obj.raw["metadata"].get("uid", "")
            for key, obj in self.emulator.objects.items()
            if key[0] == resource and key[1] == namespace and not obj.deleted
        }

    def _says_so(self, obj: dict[str, Any], namespace: str) -> bool:
        meta = obj.get("metadata") or {}
        services = self._services(namespace)
        label = (meta.get("labels") or {}).get(LABEL)
        if label is not None:
            return label in services
        return any(
            r.get("kind") == "ModelService" and services.get(r.get("name")) == r.get("uid")
            for r in meta.get("ownerReferences") or ()
        )

    def _controller(self, obj: dict[str, Any], path: str, namespace: str) -> dict[str, Any] | None:
        ref = next((r for r in (obj.get("metadata") or {}).get("ownerReferences") or () if r.get("controller")), None)
        if ref is None:
            return None
        owner = self.emulator.get(path, namespace, ref.get("name"))
        return owner if owner is not None and owner["metadata"].get("uid") == ref.get("uid") else None

    def _belongs(self, plural: str, obj: dict[str, Any], namespace: str) -> bool:
        if plural != "pods":
            return self._says_so(obj, namespace)
        rs = self._controller(obj, "apps/v1/replicasets", namespace)
        deployment = None if rs is None else self._controller(rs, "apps/v1/deployments", namespace)
        return deployment is not None and self._says_so(deployment, namespace)


def install(emulator: ClusterEmulator, msvc_path: str) -> OwnershipAudit:
    audit = OwnershipAudit(emulator, msvc_path)
    emulator.write_audit = audit
    return audit
