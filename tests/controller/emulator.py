"""A project-owned Kubernetes API emulator: kmock's ``KubernetesEmulator`` plus what a real API server
does and kmock does not, as far as the staged deletion depends on it.

Added here: ``uid``, ``resourceVersion`` bumped on every write, ``creationTimestamp``, ``generateName``,
``labelSelector`` on lists, DeleteOptions preconditions answering 409, ``gracePeriodSeconds`` and
pods that stay Terminating (``deletionTimestamp`` = now + grace) until the simulated kubelet removes
them, Background garbage collection by ``ownerReferences``, a status subresource that leaves spec
alone (and a main-resource write that leaves status alone), and node readiness (a kubelet on a
NotReady node never confirms anything).

Faults on purpose: :meth:`ClusterEmulator.fail` makes one call answer an error status (a 403 on a
DELETE, a 500 on a GET) until :meth:`ClusterEmulator.heal`; deleting an entry of ``resources`` makes
its group version unserved (discovery answers 404), as when a CRD such as the Gateway API is missing.

For recycling and lifecycle rules: the ``pods/eviction`` subresource with PodDisruptionBudgets
(:meth:`ClusterEmulator._evict`, PDB status computed from Ready pods), a Deployment controller
(:meth:`ClusterEmulator.deployments`: pods kept at ``spec.replicas`` with ``startTime``, ``podIP`` and
Ready after a delay, status counts; ``generation`` bumped on spec changes), ``metadata.resourceVersion``
in a patch as a precondition (409 when stale), and RBAC: :attr:`ClusterEmulator.rbac` set to the
rules of the chart's rendered Role answers everything else 403 with a real ``Status`` body, and
:meth:`ClusterEmulator.forbid` takes one verb on one resource away (an image newer than its chart).

For leader election: ``coordination.k8s.io/v1`` Leases, and PUT on any object (a replace: server-set
metadata and a status subresource kept, ``generation`` bumped on a spec change; RBAC verb ``update``)
with ``metadata.resourceVersion`` as a precondition, as on PATCH: stale answers 409 Conflict with a
real ``Status`` body. :attr:`ClusterEmulator.lease_writes` records every accepted Lease write and
:meth:`ClusterEmulator.fail_when` fails the requests a predicate picks (one replica's renewals).

Not emulated: admission, OpenAPI validation and defaulting (the CRD schema is checked separately),
field selectors, watch bookmarks and ``resourceVersion`` resumption, strategic merge patch,
ReplicaSets (the Deployment owns its pods directly).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock

from router.decisions import durations

#: Seconds after its deletion that a simulated container exits by itself (its drain/preStop took this
#: long); without it the container ignores SIGTERM and is killed at the end of its grace.
EXITS_AFTER = "emulator.test/exits-after-secs"

RESOURCES = {
    "v1/pods": ("Pod", True, {"eviction"}),
    "v1/nodes": ("Node", False, set()),
    "v1/services": ("Service", True, set()),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, set()),
    "apps/v1/deployments": ("Deployment", True, {"status"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
    "gateway.networking.k8s.io/v1/httproutes": ("HTTPRoute", True, {"status"}),
    "inference.networking.k8s.io/v1/inferencepools": ("InferencePool", True, {"status"}),
    "coordination.k8s.io/v1/leases": ("Lease", True, set()),
}

LEASES = "coordination.k8s.io/v1/leases"


TEST_CLIENT = "kmock/"
"""User-Agent prefix of the tests' own HTTP client (kmock's): RBAC mode checks only the
controller's calls (kopf's and kubernetes_asyncio's)."""


def _status(code: int, reason: str | None, message: str, *, name: str, success: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "code": code,
        "details": {"name": name, "kind": "pods"},
    }
    if reason:
        body["reason"] = reason
    if message:
        body["message"] = message
    return body


def _budget(name: str, cause: str) -> dict[str, Any]:
    body = _status(
        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.", name=name
    )
    body["details"]["causes"] = [{"reason": "DisruptionBudget", "message": cause}]
    return body


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """The label selector subset the controller sends: ``k=v``, ``k in (a,b)``, ``k notin (...)``,
    ``k``, ``!k``, comma-joined (commas inside parentheses belong to the set)."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    for term in (t.strip() for t in terms if t.strip()):
        if " notin " in term:
            key, values = term.split(" notin ", 1)
            if labels.get(key.strip()) in values.strip("() ").split(","):
                return False
        elif " in " in term:
            key, values = term.split(" in ", 1)
            if labels.get(key.strip()) not in values.strip("() ").split(","):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term not in labels:
            return False
    return True


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector object (``matchLabels``, ``matchExpressions``); an empty one matches everything,
    as for a PodDisruptionBudget."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or ()
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


#: kmock's actions -> RBAC verbs.
VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "UPDATE": "patch", "DELETE": "delete"}
#: The user the emulated controller runs as, in 403 messages.
CONTROLLER_USER = "system:serviceaccount:drain-router:drain-router-controller"

Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


def rules_of(roles: Iterable[dict[str, Any]]) -> list[Rule]:
    """The rules of rendered Role/ClusterRole documents, as (apiGroups, resources, verbs)."""
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for role in roles for r in role["rules"]]


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


@attrs.frozen(kw_only=True)
class Eviction:
    """One eviction request as the API server saw it."""

    pod: str
    uid: str
    code: int
    at: float
    unsettled: tuple[str, ...]
    """Pods of the namespace terminating or not Ready when it arrived (before it was applied)."""


@attrs.frozen(kw_only=True)
class LeaseWrite:
    """One write of a Lease that the API server accepted."""

    name: str
    holder: str
    resource_version: str
    at: float


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    clock: Any = time.time
    rbac: list[Rule] | None = None
    """``None``: everything allowed. A list of rules: only what they grant, the rest 403 (the tests'
    own requests, User-Agent :data:`TEST_CLIENT`, are exempt)."""
    ready_after: float = 0.2
    """Seconds after its start that a Deployment's pod turns Ready (the process-backed kubelet instead
    waits for the pod's router to answer)."""
    pdb_controller_paused: bool = False
    """While set, PodDisruptionBudget status is not recomputed (``observedGeneration`` lags)."""
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _faults: dict[Any, tuple[int, str, str]] = attrs.field(factory=dict, init=False)
    _forbidden: set[tuple[str, str]] = attrs.field(factory=set, init=False)
    _ips: Any = attrs.field(factory=lambda: itertools.count(2), init=False)
    evictions: list[Eviction] = attrs.field(factory=list, init=False)
    """Every eviction asked for, in order."""
    lease_writes: list[LeaseWrite] = attrs.field(factory=list, init=False)
    """Every accepted Lease create or update, in order."""
    on_lease_write: Callable[[LeaseWrite], None] | None = None
    """Called (under the lock, must not block) for each accepted Lease write, as it is applied."""
    _fault_rules: list[tuple[Callable[[Any], bool], tuple[int, str, str]]] = attrs.field(factory=list, init=False)
    on_pod_created: Callable[[dict[str, Any]], None] | None = None
    """Called (under the lock, must not block) for each pod the Deployment controller creates; the
    process-backed kubelet starts the pod's router from it."""
    pod_may_be_ready: Callable[[dict[str, Any]], bool] | None = None
    """``None``: pods turn Ready :attr:`ready_after` seconds after they start. Set: also only once it
    says so (the process-backed kubelet: once the pod's router listens)."""
    on_pod_removed: Callable[[dict[str, Any]], None] | None = None
    """Called (under the lock, must not block) when a pod object is removed for good (its container
    exited, or SIGKILL at the end of its grace); the process-backed kubelet kills a router still
    running then."""
    on_pod_deleted: Callable[[dict[str, Any]], None] | None = None
    """Called (under the lock, must not block) when a pod is marked deleted; the process-backed
    kubelet uses it to SIGTERM the pod's router."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for path, (kind, namespaced, subresources) in RESOURCES.items():
            self.resources[path] = kmock.ResourceInfo(
                kind=kind,
                namespaced=namespaced,
                subresources=subresources,
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )

    # --- helpers for tests ------------------------------------------------------------------------

    def key(self, path: str, namespace: str | None, name: str) -> Any:
        return (kmock.resource(path), namespace, name)

    def get(self, path: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self.key(path, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as a client would (uid, resourceVersion, timestamps assigned)."""
        async with self._lock:
            created = self._create(kmock.resource(path), copy.deepcopy(obj))[1]
            await self._flush()
            return created

    def fail(self, action: str, path: str, name: str, status: int, reason: str, message: str) -> None:
        """Answer ``action`` (``fetch``, ``delete``, ...) on ``path``/``name`` with this error status."""
        self._faults[(kmock.action(action.upper()), kmock.resource(path), name)] = (status, reason, message)

    def fail_when(self, predicate: Callable[[Any], bool], status: int, reason: str, message: str) -> None:
        """Answer every request ``predicate`` picks (kmock's request: ``method``, ``resource``,
        ``name``, ``data``...) with this error status, e.g. one replica's Lease renewals."""
        self._fault_rules.append((predicate, (status, reason, message)))

    def heal(self) -> None:
        self._faults.clear()
        self._fault_rules.clear()
        self._forbidden.clear()

    def forbid(self, verb: str, resource: str) -> None:
        """Answer ``verb`` (``create``, ``patch``, ...) on ``resource`` (``pods/eviction``) with 403,
        as when the image is newer than the chart that granted its RBAC."""
        self._forbidden.add((verb, resource))

    def allocate_ip(self) -> str:
        """The next pod IP: 127.0.0.2, 127.0.0.3, ... (loopback, so a real router can bind it)."""
        n = next(self._ips)
        if n > 254:
            raise RuntimeError("the emulator hands out at most 253 pod IPs (127.0.0.2-254)")
        return f"127.0.0.{n}"

    async def set_pod_ready(self, name: str, ready: bool, namespace: str = "ns") -> None:
        async with self._lock:
            key = self.key("v1/pods", namespace, name)
            conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
            self._write(key, {"status": {"conditions": conditions}})
            await self._flush()

    def pdb_status(self, pdb: dict[str, Any]) -> dict[str, Any]:
        """What the disruption controller would write: healthy = Ready, not terminating pods the
        PDB selects; desired from ``minAvailable`` or ``maxUnavailable`` (int or percent)."""
        namespace = pdb["metadata"]["namespace"]
        spec = pdb.get("spec") or {}
        pods = [
            o.raw
            for (res, ns, _), o in self.objects.items()
            if res == kmock.resource("v1/pods")
            and ns == namespace
            and not o.deleted
            and (o.raw.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and selector_matches(spec.get("selector"), o.raw["metadata"].get("labels") or {})
        ]
        expected = len(pods)
        healthy = sum(1 for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp"))

        def amount(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-expected * int(value[:-1]) // 100)  # rounded up, as the API server does
            return int(value)

        if "minAvailable" in spec:
            desired = amount(spec["minAvailable"])
        else:
            desired = max(expected - amount(spec.get("maxUnavailable", 0)), 0)
        return {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": max(healthy - desired, 0),
        }

    def _refresh_pdbs(self, namespace: str) -> list[tuple[Any, dict[str, Any]]]:
        pdbs = []
        for key, obj in self.objects.items():
            if key[0] != kmock.resource("policy/v1/poddisruptionbudgets") or key[1] != namespace or obj.deleted:
                continue
            if not self.pdb_controller_paused:
                obj.patch({"status": self.pdb_status(obj.raw)})
            pdbs.append((key, obj.raw))
        return pdbs

    async def deployments(self, interval: float = 0.05) -> None:
        """The Deployment controller and the pods' readiness, in one loop, until cancelled: each
        Deployment (not deleting) keeps ``spec.replicas`` (default 1) pods it owns from
        ``spec.template``, each with ``startTime`` and a ``podIP``, Ready some seconds after
        it started (:attr:`ready_after`); surplus pods are deleted gracefully, newest first; status counts follow."""
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                self._reconcile_deployments(self.ready_after)
                await self._flush()

    def _reconcile_deployments(self, ready_after: float) -> None:
        now = self.clock()
        pods_res, deploy_res = kmock.resource("v1/pods"), kmock.resource("apps/v1/deployments")
        for key in [k for k, o in self.objects.items() if k[0] == pods_res and not o.deleted]:
            pod = self.objects[key].raw
            status = pod.get("status") or {}
            start = status.get("startTime")
            if (
                start
                and not _ready(pod)
                and not pod["metadata"].get("deletionTimestamp")
                and status.get("phase") == "Running"
                and (self.pod_may_be_ready is None or self.pod_may_be_ready(pod))
                and now >= durations.parse_time(start) + ready_after
            ):
                self._write(key, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        for key in [k for k, o in self.objects.items() if k[0] == deploy_res and not o.deleted]:
            deployment = self.objects[key].raw
            meta, spec = deployment["metadata"], deployment.get("spec") or {}
            if meta.get("deletionTimestamp") or "template" not in spec:
                continue
            desired = 1 if spec.get("replicas") is None else int(spec["replicas"])
            owned = sorted(
                (
                    o.raw
                    for k, o in self.objects.items()
                    if k[0] == pods_res
                    and not o.deleted
                    and k[1] == key[1]
                    and any(r.get("uid") == meta["uid"] for r in o.raw["metadata"].get("ownerReferences") or ())
                    and (o.raw.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                ),
                key=lambda p: p["metadata"]["creationTimestamp"] + p["metadata"]["name"],
            )
            alive = [p for p in owned if not p["metadata"].get("deletionTimestamp")]
            for pod in alive[desired:][::-1]:
                self._delete((pods_res, key[1], pod["metadata"]["name"]), {})
            for _ in range(desired - len(alive)):
                template = copy.deepcopy(spec["template"])
                pod_meta = template.get("metadata") or {}
                pod_meta.update(
                    namespace=key[1],
                    generateName=f"{meta['name']}-",
                    ownerReferences=[
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                )
                template["metadata"] = pod_meta
                template["status"] = {
                    "phase": "Running",
                    "startTime": durations.format_time(now),
                    "podIP": self.allocate_ip(),
                    "conditions": [{"type": "Ready", "status": "False"}],
                }
                _, created = self._create(pods_res, template)
                if self.on_pod_created is not None:
                    self.on_pod_created(created)
            alive = [
                p
                for p in (
                    self.objects[(pods_res, key[1], n)].raw
                    for n in [
                        k[2] for k, o in self.objects.items() if k[0] == pods_res and k[1] == key[1] and not o.deleted
                    ]
                )
                if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or ())
                and not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            ready = sum(1 for p in alive if _ready(p))
            status = {
                "observedGeneration": meta.get("generation", 1),
                "replicas": len(alive),
                "updatedReplicas": len(alive),
                "readyReplicas": ready,
                "availableReplicas": ready,
            }
            current = deployment.get("status") or {}
            if any(current.get(k) != v for k, v in status.items()):
                self._write(key, {"status": status})

    async def set_node_ready(self, name: str, ready: bool) -> None:
        async with self._lock:
            key = self.key("v1/nodes", None, name)
            self._write(key, {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})
            await self._flush()

    async def kubelet(self, interval: float = 0.05) -> None:
        """Finish terminating pods: at their exit time (``EXITS_AFTER``) or at the end of their
        grace (SIGKILL), but only on a Ready node. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                for key in list(self.objects):
                    if key[0] != kmock.resource("v1/pods") or self.objects[key].deleted:
                        continue
                    pod = self.objects[key].raw
                    meta = pod["metadata"]
                    if not meta.get("deletionTimestamp"):
                        continue
                    node = (pod.get("spec") or {}).get("nodeName")
                    if node and not self._node_ready(node):
                        continue
                    end = durations.parse_time(meta["deletionTimestamp"])
                    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                    exits = (meta.get("annotations") or {}).get(EXITS_AFTER)
                    if exits is not None:
                        end = min(end, end - grace + float(exits))
                    if self.clock() >= end:
                        self._hard_delete(key)
                await self._flush()

    # --- the API server ---------------------------------------------------------------------------

    def _node_ready(self, name: str) -> bool:
        node = self.get("v1/nodes", None, name)
        if node is None:
            return False
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or ()
        )

    def _now(self) -> str:
        return durations.format_time(self.clock())

    _pending: list[Any] = attrs.field(factory=list, init=False)

    def _create(self, resource: Any, obj: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        info = self.resources.get(resource, None)
        namespace = meta.get("namespace") if (info is None or info.namespaced) else None
        key = (resource, namespace, meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=f"{meta['name']} already exists")
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=str(next(self._rv)), creationTimestamp=self._now(), generation=1
        )
        if resource == kmock.resource("v1/pods"):
            obj.setdefault("status", {}).setdefault("phase", "Running")
        if key in self.objects:
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        self._pending.append((resource, "ADDED", copy.deepcopy(obj)))
        return key, obj

    def _write(self, key: Any, patch: Any) -> dict[str, Any]:
        obj = self.objects[key]
        if isinstance(patch, list):  # JSON patch; a failed ``test`` op is 422, as on a real server
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(obj.raw), patch)
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
            obj.history.append(new)
        else:
            before = copy.deepcopy(obj.raw.get("spec"))
            obj.patch(patch)
            if key[0] != kmock.resource("v1/pods") and obj.raw.get("spec") != before:
                obj.patch({"metadata": {"generation": int(obj.raw["metadata"].get("generation") or 1) + 1}})
        obj.patch({"metadata": {"resourceVersion": str(next(self._rv))}})
        raw = obj.raw
        meta = raw["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and key[0] != kmock.resource("v1/pods"):
            self._hard_delete(key)
        else:
            self._pending.append((key[0], "MODIFIED", copy.deepcopy(raw)))
        return raw

    def _hard_delete(self, key: Any) -> None:
        obj = self.objects[key]
        obj.patch({"metadata": {"resourceVersion": str(next(self._rv))}})
        raw = copy.deepcopy(obj.raw)
        obj.delete()
        self._pending.append((key[0], "DELETED", raw))
        if key[0] == kmock.resource("v1/pods") and self.on_pod_removed is not None:
            self.on_pod_removed(raw)
        # Background garbage collection: dependents go after their owner.
        uid = raw["metadata"].get("uid")
        for other in list(self.objects):
            if self.objects[other].deleted or other[1] != key[1]:
                continue
            owners = self.objects[other].raw["metadata"].get("ownerReferences") or ()
            if any(o.get("uid") == uid for o in owners):
                self._delete(other, {})

    def _delete(self, key: Any, options: dict[str, Any]) -> dict[str, Any]:
        raw = self.objects[key].raw
        meta = raw["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Precondition failed: UID in precondition: {pre['uid']}, "
                f"UID in object meta: {meta.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message="Precondition failed: resourceVersion")
        is_pod = key[0] == kmock.resource("v1/pods")
        if is_pod:
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = (raw.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            if grace == 0:
                self._hard_delete(key)
            elif not meta.get("deletionTimestamp"):
                stamp = durations.format_time(self.clock() + grace)
                self._write(key, {"metadata": {"deletionTimestamp": stamp, "deletionGracePeriodSeconds": grace}})
                if self.on_pod_deleted is not None:
                    self.on_pod_deleted(self.objects[key].raw)
        elif meta.get("deletionTimestamp"):
            pass
        elif meta.get("finalizers"):
            self._write(key, {"metadata": {"deletionTimestamp": self._now()}})
        else:
            self._hard_delete(key)
        return raw

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for resource, kind, raw in pending:
            await self._buses[resource].put({"type": kind, "object": raw})

    async def _handle(self, request: Any) -> Any:
        action = request.action
        fault = self._faults.get((action, request.resource, request.name))
        fault = fault or next((f for predicate, f in self._fault_rules if predicate(request)), None)
        if fault is not None:
            status, reason, message = fault
            return await self._render_error(kmock.KubernetesError(status=status, reason=reason, message=message))
        denied = self._denied(request)
        if denied is not None:
            return aiohttp.web.json_response(denied, status=403)
        if (
            request.resource == kmock.resource("v1/pods")
            and request.subresource == "eviction"
            and request.method == "POST"
        ):
            async with self._lock:
                unsettled = sorted(
                    o.raw["metadata"]["name"]
                    for k, o in self.objects.items()
                    if k[0] == kmock.resource("v1/pods")
                    and k[1] == request.namespace
                    and not o.deleted
                    and (o.raw["metadata"].get("deletionTimestamp") or not _ready(o.raw))
                )
                code, body = self._evict(request.namespace, request.name, request.data or {})
                self.evictions.append(
                    Eviction(
                        pod=request.name,
                        code=code,
                        at=self.clock(),
                        unsettled=tuple(unsettled),
                        uid=((request.data or {}).get("deleteOptions") or {}).get("preconditions", {}).get("uid", ""),
                    )
                )
                await self._flush()
            return aiohttp.web.json_response(body, status=code)
        if request.resource is not None and request.name and request.method == "PUT" and not request.subresource:
            try:
                async with self._lock:
                    raw = copy.deepcopy(self._replace(request))
                    await self._flush()
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
            return aiohttp.web.json_response(raw)
        if request.resource is not None and action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            try:
                async with self._lock:
                    self._mutate(request)
                    await self._flush()
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        return await kmock.KubernetesScaffold._handle(self, request)

    def _denied(self, request: Any) -> dict[str, Any] | None:
        """The 403 ``Status`` for a request RBAC does not allow, ``None`` when allowed. The tests' own
        requests (:data:`TEST_CLIENT`) and non-resource URLs (discovery) are always allowed."""
        if (
            request.resource is None
            or request.resource.plural is None
            or request.headers.get("User-Agent", "").startswith(TEST_CLIENT)
        ):
            return None
        if request.subresource == "eviction" and request.method == "POST":
            verb = "create"
        elif request.method == "PUT":
            verb = "update"
        elif request.action is None:
            return None
        else:
            verb = VERBS[request.action.value]
        plural = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        group = request.resource.group or ""
        allowed = (verb, plural) not in self._forbidden
        if allowed and self.rbac is not None:
            allowed = any(
                group in groups and plural in resources and verb in verbs for groups, resources, verbs in self.rbac
            )
        if allowed:
            return None
        where = f' in the namespace "{request.namespace}"' if request.namespace else " at the cluster scope"
        subject = f'{request.resource.plural} "{request.name}"' if request.name else request.resource.plural
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "reason": "Forbidden",
            "message": f'{subject} is forbidden: User "{CONTROLLER_USER}" cannot {verb} resource '
            f'"{plural}" in API group "{group}"{where}',
            "details": {"name": request.name or "", "group": group, "kind": request.resource.plural},
            "code": 403,
        }

    def _evict(self, namespace: str, name: str, eviction: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The Eviction subresource, after the API server's ``pkg/registry/core/pod/storage/eviction.go``."""
        key = (kmock.resource("v1/pods"), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return 404, _status(404, "NotFound", f'pods "{name}" not found', name=name)
        pod = self.objects[key].raw
        options = eviction.get("deleteOptions") or {}
        uid = (options.get("preconditions") or {}).get("uid")
        if uid and uid != pod["metadata"].get("uid"):
            return 409, _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": Precondition '
                f"failed: UID in precondition: {uid}, UID in object meta: "
                f"{pod['metadata'].get('uid')}",
                name=name,
            )
        success = _status(201, None, "", name=name, success=True)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            self._delete(key, options)  # nothing to protect: no budget check
            return 201, success
        pdbs = [
            (k, raw)
            for k, raw in self._refresh_pdbs(namespace)
            if selector_matches((raw.get("spec") or {}).get("selector"), pod["metadata"].get("labels") or {})
        ]
        if len(pdbs) > 1:
            return 500, _status(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                name=name,
            )
        if pdbs:
            pdb_key, pdb = pdbs[0]
            status, pdb_name = pdb.get("status") or {}, pdb["metadata"]["name"]
            if (status.get("observedGeneration") or 0) < pdb["metadata"].get("generation", 1):
                return 429, _budget(name, f"The disruption budget {pdb_name} is still being processed by the server.")
            unhealthy_ok = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow" and not _ready(
                pod
            )
            if not unhealthy_ok:
                if (status.get("disruptionsAllowed") or 0) <= 0:
                    return 429, _budget(
                        name,
                        f"The disruption budget {pdb_name} needs "
                        f"{status.get('desiredHealthy')} healthy pods and has "
                        f"{status.get('currentHealthy')} currently",
                    )
                self.objects[pdb_key].patch({"status": {"disruptionsAllowed": status["disruptionsAllowed"] - 1}})
        self._delete(key, options)
        return 201, success

    def _conflict(self, resource: Any, name: str) -> kmock.KubernetesError:
        return kmock.KubernetesError(
            status=409,
            reason="Conflict",
            message=f'Operation cannot be fulfilled on {resource.plural} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            details={"name": name, "group": resource.group or "", "kind": resource.plural},
        )

    def _replace(self, request: Any) -> dict[str, Any]:
        """PUT: the body replaces the object; a ``metadata.resourceVersion`` that is not the current
        one answers 409 Conflict (optimistic concurrency); server-set metadata and, where there is a
        status subresource, the status are kept."""
        resource, namespace, name = request.resource, request.namespace, request.name
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{resource.plural} {name!r} not found")
        current = self.objects[key].raw
        body = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = body.setdefault("metadata", {})
        expected = meta.get("resourceVersion")
        if expected is not None and expected != current["metadata"].get("resourceVersion"):
            raise self._conflict(resource, name)
        for field in ("uid", "creationTimestamp", "generation", "namespace", "name", "deletionTimestamp"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
        if resource in self.resources and "status" in self.resources[resource].subresources:
            body["status"] = current.get("status")
        if body.get("spec") != current.get("spec") and resource != kmock.resource("v1/pods"):
            meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
        self.objects[key].history.append(body)
        raw = self._write(key, {})
        self._lease_written(resource, raw)
        return raw

    def _lease_written(self, resource: Any, raw: dict[str, Any]) -> None:
        if resource != kmock.resource(LEASES):
            return
        write = LeaseWrite(
            name=raw["metadata"]["name"],
            holder=(raw.get("spec") or {}).get("holderIdentity") or "",
            resource_version=raw["metadata"]["resourceVersion"],
            at=self.clock(),
        )
        self.lease_writes.append(write)
        if self.on_lease_write is not None:
            self.on_lease_write(write)

    def _mutate(self, request: Any) -> None:
        resource, namespace, name = request.resource, request.namespace, request.name
        if request.action == kmock.action.CREATE:
            obj = request.data
            if namespace:
                obj.setdefault("metadata", {})["namespace"] = namespace
            self._lease_written(resource, self._create(resource, obj)[1])
            return
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{resource} {name!r} not found")
        if request.action == kmock.action.DELETE:
            self._delete(key, request.data if isinstance(request.data, dict) else {})
            return
        patch = request.data
        if isinstance(patch, dict):
            expected = (patch.get("metadata") or {}).get("resourceVersion")
            current = self.objects[key].raw["metadata"].get("resourceVersion")
            if expected is not None and expected != current:
                raise self._conflict(resource, name)
            if expected is not None:
                patch = copy.deepcopy(patch)
                del patch["metadata"]["resourceVersion"]
        has_status = resource in self.resources and "status" in self.resources[resource].subresources
        if isinstance(patch, dict):
            if request.subresource == "status":
                patch = {"status": patch.get("status")} if "status" in patch else {}
            elif has_status:
                patch = {k: v for k, v in patch.items() if k != "status"}
        elif isinstance(patch, list):
            on_status = [op for op in patch if op.get("path", "").startswith("/status")]
            patch = (
                on_status
                if request.subresource == "status"
                else ([op for op in patch if op not in on_status] if has_status else patch)
            )
        self._write(key, patch)

    async def _serve_list(self, request: Any) -> Any:
        selector = (request.params or {}).get("labelSelector")
        async with self._lock:
            items = [
                copy.deepcopy(obj.raw)
                for (res, ns, _), obj in self.objects.items()
                if res == request.resource
                and not obj.deleted
                and (request.namespace is None or ns == request.namespace)
            ]
        if selector:
            items = [i for i in items if _selector_matches(selector, (i["metadata"].get("labels") or {}))]
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": str(next(self._rv))},
            "items": items,
        }
