"""A project-owned Kubernetes API emulator: kmock's ``KubernetesEmulator`` plus what a real API server
and its controllers do and kmock does not, as far as the controller depends on it.

The API server: ``uid``, ``resourceVersion`` bumped on every write, ``creationTimestamp``,
``generateName``, ``generation`` bumped on a ``spec`` change, ``labelSelector`` on lists,
DeleteOptions preconditions answering 409, ``metadata.resourceVersion`` in a patch or a PUT as a
precondition (409 when stale), a status subresource that leaves spec alone (and a main-resource write
that leaves status alone), PUT as a replacement (RBAC verb ``update``) and PATCH as a merge or JSON
patch (verb ``patch``), ``gracePeriodSeconds`` and pods that stay Terminating (``deletionTimestamp`` =
now + grace) until the simulated kubelet removes them, ``propagationPolicy: Orphan``. A CRD installed
with :meth:`ClusterEmulator.install_crd` gets its structural schema applied on every create and update
(:mod:`schema`: pruning of unknown fields, defaults, OpenAPI validation and the
``x-kubernetes-validations`` CEL rules, a 422 ``Invalid`` ``Status`` with ``details.causes``;
unchanged values ratchet).

The controllers, in one loop (:meth:`ClusterEmulator.controllers`), each on the emulator's
:attr:`~ClusterEmulator.clock`:

- Deployment -> ReplicaSet -> pods, after ``pkg/controller/deployment``: a ReplicaSet per
  ``pod-template-hash``; a ``spec.template`` change rolls out through a new ReplicaSet within
  ``maxSurge``/``maxUnavailable`` (default 25%); ``spec.replicas`` scales. The Deployment's
  ``status`` (``observedGeneration``, ``replicas``, ``updatedReplicas``, ``readyReplicas``,
  ``availableReplicas``, ``unavailableReplicas``; zero counts omitted) is published
  :attr:`~ClusterEmulator.status_delay` seconds after the state it describes, never in the tick
  that changed it.
- pods: ``Pending`` without ``podIP`` or ``startTime`` for :attr:`~ClusterEmulator.pending_for`
  seconds, then ``Running``, then Ready :attr:`~ClusterEmulator.ready_after` seconds later; node
  readiness (a kubelet on a NotReady node never confirms a deletion).
- the disruption controller: PodDisruptionBudget status recomputed every
  :attr:`~ClusterEmulator.pdb_interval` seconds; the ``pods/eviction`` subresource
  (:meth:`ClusterEmulator._evict`) reads the stored status and decrements ``disruptionsAllowed``.
- the garbage collector: in the background, a dependent whose owners are all gone is deleted
  :attr:`~ClusterEmulator.gc_delay` seconds after the last one went (a Deployment's pods: two delays,
  through the ReplicaSet); ``propagationPolicy: Foreground`` keeps an owner terminating (finalizer
  ``foregroundDeletion``) until its dependents, deleted in the foreground themselves, are gone.

Faults on purpose: :meth:`ClusterEmulator.fail` makes one call answer an error status (a 403 on a
DELETE, a 500 on a GET) until :meth:`ClusterEmulator.heal`; deleting an entry of ``resources`` makes
its group version unserved (discovery answers 404), as when a CRD such as the Gateway API is missing.
RBAC: :attr:`ClusterEmulator.rbac` set to the rules of the chart's rendered Role answers everything
else 403 with a real ``Status`` body, and :meth:`ClusterEmulator.forbid` takes one verb on one
resource away (an image newer than its chart).

For leader election: ``coordination.k8s.io/v1`` Leases (written by PUT, above);
:attr:`ClusterEmulator.lease_writes` records every accepted Lease write and
:meth:`ClusterEmulator.fail_when` fails the requests a predicate picks (one replica's renewals).

Not emulated: admission webhooks and built-in types' validation and defaulting, field selectors,
watch bookmarks and ``resourceVersion`` resumption, strategic merge patch and server-side apply, the
``/scale`` subresource (the controller patches ``spec.replicas``), the ``Recreate`` strategy,
``minReadySeconds``, ``progressDeadlineSeconds`` and Deployment conditions, pod deletion cost, the disruption controller's ``disruptedPods`` map (an eviction marks the pod
terminating at once, so it is never counted healthy twice), and the schema features listed in
:mod:`schema`. Pods created by a test (not by a ReplicaSet) keep the status they were given.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock

from drain_router.decisions import durations

from . import schema as schema_

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
    "apps/v1/replicasets": ("ReplicaSet", True, {"status"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
    "v1/configmaps": ("ConfigMap", True, set()),
    "discovery.k8s.io/v1/endpointslices": ("EndpointSlice", True, set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
    "gateway.networking.k8s.io/v1/httproutes": ("HTTPRoute", True, {"status"}),
    "inference.networking.k8s.io/v1/inferencepools": ("InferencePool", True, {"status"}),
    "coordination.k8s.io/v1/leases": ("Lease", True, set()),
}

LEASES = "coordination.k8s.io/v1/leases"

MORE_GATEWAY_API = {
    "gateway.networking.k8s.io/v1/grpcroutes": ("GRPCRoute", True, {"status"}),
    "gateway.networking.k8s.io/v1beta1/referencegrants": ("ReferenceGrant", True, set()),
}
"""Served only when a test asks (:meth:`ClusterEmulator.serve`): with them, deleting ``httproutes``
would no longer make the Gateway API's group version unserved."""


HASH_LABEL = "pod-template-hash"
FOREGROUND = "foregroundDeletion"
"""The finalizer a ``propagationPolicy: Foreground`` delete puts on an owner with dependents."""


def _template_hash(template: dict[str, Any]) -> str:
    """A stable hash of a pod template, as the ``pod-template-hash`` label (the real one is an FNV
    hash of the template rendered safe for names; any stable digest behaves the same here)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return "".join(ch for ch in digest if ch in "bcdfghjklmnpqrstvwxz2456789")[:10] or digest[:10]


def _rolling_limits(spec: dict[str, Any], desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) of ``spec.strategy.rollingUpdate`` for ``desired`` replicas: percents
    of ``desired`` (surge rounded up, unavailable down), default 25% each; both 0 makes unavailable 1."""
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}

    def resolve(value: Any, up: bool) -> int:
        if isinstance(value, str) and value.endswith("%"):
            scaled = desired * int(value[:-1])
            return -(-scaled // 100) if up else scaled // 100
        return int(value)

    surge = resolve(rolling.get("maxSurge", "25%"), up=True)
    unavailable = resolve(rolling.get("maxUnavailable", "25%"), up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def _owner_ref(api_version: str, kind: str, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _merge(base: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386): objects merge, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


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


#: kmock's actions -> RBAC verbs (kmock's UPDATE is a PATCH; a PUT, which kmock leaves without an
#: action, is the verb ``update``: see :meth:`ClusterEmulator._verb`).
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
    rolling_out: tuple[str, ...] = ()
    """Deployments of the namespace whose rollout was not complete when it arrived, as the emulated
    controller knew it (not as its late status said): pods not all of the current template, not all
    available, or not ``spec.replicas`` of them."""


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
    pending_for: float = 0.1
    """Seconds a ReplicaSet's pod stays ``Pending`` (no ``podIP``, no ``startTime``) before ``Running``."""
    ready_after: float = 0.2
    """Seconds after its start that a Deployment's pod turns Ready (the process-backed kubelet instead
    waits for the pod's router to answer)."""
    status_delay: float = 0.15
    """Seconds the Deployment controller's status lags what it computes (pods, ReplicaSets, ``spec``):
    a readiness change or a new ``generation`` shows in the Deployment's status this much later."""
    pdb_interval: float = 0.15
    """Seconds between two passes of the disruption controller over every PodDisruptionBudget."""
    gc_delay: float = 0.15
    """Seconds after its last owner went that the garbage collector deletes a dependent."""
    pdb_controller_paused: bool = False
    """While set, PodDisruptionBudget status is not recomputed (``observedGeneration`` lags)."""
    schemas: dict[Any, schema_.Structural] = attrs.field(factory=dict)
    """Resource -> its structural schema (:meth:`install_crd`): pruning, defaulting, validation."""
    _born: dict[str, float] = attrs.field(factory=dict, init=False)
    """uid -> when it was created (on :attr:`clock`)."""
    _gone: dict[str, float] = attrs.field(factory=dict, init=False)
    """uid -> when the object was removed, for the garbage collector."""
    _seen: dict[Any, list[tuple[float, dict[str, Any]]]] = attrs.field(factory=dict, init=False)
    """Deployment key -> the statuses computed and not yet published, with when."""
    _pdb_due: float = attrs.field(default=0.0, init=False)
    ticks: int = attrs.field(default=0, init=False)
    """Passes of :meth:`controllers` so far: a test waits for the next pass, never for a time."""
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
    """Called (under the lock, must not block) when a ReplicaSet's pod leaves ``Pending`` (it has its
    ``podIP`` from then on); the process-backed kubelet starts the pod's router from it."""
    pod_may_be_ready: Callable[[dict[str, Any]], bool] | None = None
    """``None``: pods turn Ready :attr:`ready_after` seconds after they start. Set: also only once it
    says so (the process-backed kubelet: once the pod's router listens)."""
    on_pod_removed: Callable[[dict[str, Any]], None] | None = None
    """Called (under the lock, must not block) when a pod object is removed for good (its container
    exited, or SIGKILL at the end of its grace); the process-backed kubelet kills a router still
    running then."""
    on_request: Callable[[Any], None] | None = None
    """Called (must not block) with each request as it arrives, before anything is answered: a test
    records the cluster as each write found it."""
    write_audit: Callable[[Any], None] | None = None
    """Called (must not block) with each request before anything is answered, the cluster as the
    request finds it: the ownership audit (:mod:`ownership_audit`)."""
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

    def serve(self, more: dict[str, tuple[str, bool, set[str]]]) -> None:
        """Serve more resources (e.g. :data:`MORE_GATEWAY_API`)."""
        for path, (kind, namespaced, subresources) in more.items():
            self.resources[path] = kmock.ResourceInfo(
                kind=kind,
                namespaced=namespaced,
                subresources=subresources,
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )

    def key(self, path: str, namespace: str | None, name: str) -> Any:
        return (kmock.resource(path), namespace, name)

    def get(self, path: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self.key(path, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def put(self, path: str, obj: dict[str, Any], *, admit: bool = True) -> dict[str, Any]:
        """Create an object as a client would (uid, resourceVersion, timestamps assigned). ``admit=False``
        skips its schema: an object stored before its CRD carried today's rules (the API server does not
        re-validate stored objects)."""
        async with self._lock:
            created = self._create(kmock.resource(path), copy.deepcopy(obj), admit=admit)[1]
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

    def install_crd(self, definition: dict[str, Any]) -> str:
        """Serve a CustomResourceDefinition's storage version, with its structural schema applied to
        every write of the main resource and its status. Returns the resource's path."""
        spec = definition["spec"]
        (version,) = [v for v in spec["versions"] if v.get("storage")]
        path = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
        self.resources[path] = kmock.ResourceInfo(
            kind=spec["names"]["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            shortnames=set(spec["names"].get("shortNames") or ()),
            subresources=set(version.get("subresources") or ()),
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )
        self.schemas[kmock.resource(path)] = schema_.Structural(version["schema"]["openAPIV3Schema"])
        return path

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

    async def controllers(self, interval: float = 0.05) -> None:
        """The controller manager and the pods' kubelet-side start, in one loop, until cancelled:
        Deployments (:meth:`_reconcile_deployments`), ReplicaSets (:meth:`_reconcile_replicasets`),
        pods from Pending to Running to Ready (:meth:`_reconcile_pods`), the disruption controller
        every :attr:`pdb_interval` and the garbage collector (:attr:`gc_delay`)."""
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                now = self.clock()
                self._reconcile_pods(now)
                self._reconcile_deployments(now)
                self._reconcile_replicasets(now)
                self._publish_deployment_status(now)
                if now >= self._pdb_due:
                    self._pdb_due = now + self.pdb_interval
                    self._disruption_controller()
                self._collect_garbage(now)
                self.ticks += 1
                await self._flush()

    def _live(self, path: str, namespace: str | None = None) -> list[tuple[Any, dict[str, Any]]]:
        """(key, object) of every object of ``path`` not removed (terminating ones included)."""
        res = kmock.resource(path)
        return [
            (k, o.raw)
            for k, o in self.objects.items()
            if k[0] == res and not o.deleted and (namespace is None or k[1] == namespace)
        ]

    def _owned(self, path: str, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The objects of ``path`` whose controller ``ownerReference`` is ``uid``, oldest first."""
        return sorted(
            (
                raw
                for _, raw in self._live(path, namespace)
                if any(
                    r.get("uid") == uid and r.get("controller") for r in raw["metadata"].get("ownerReferences") or ()
                )
            ),
            key=lambda o: (self._born.get(o["metadata"]["uid"], 0.0), o["metadata"]["name"]),
        )

    def _reconcile_pods(self, now: float) -> None:
        """The kubelet's side of a ReplicaSet's pod: ``Pending`` (no ``podIP``, no ``startTime``) for
        :attr:`pending_for` seconds, then ``Running`` with both, then Ready :attr:`ready_after` seconds
        after it started (and once :attr:`pod_may_be_ready` agrees)."""
        for key, pod in self._live("v1/pods"):
            status = pod.get("status") or {}
            if pod["metadata"].get("deletionTimestamp"):
                continue
            born = self._born.get(pod["metadata"]["uid"])
            if status.get("phase") == "Pending" and born is not None and now >= born + self.pending_for:
                status = {
                    "phase": "Running",
                    "startTime": durations.format_time(now),
                    "podIP": self.allocate_ip(),
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                    ],
                }
                pod = self._write(key, {"status": status})
                if self.on_pod_created is not None:
                    self.on_pod_created(pod)
                continue
            start = status.get("startTime")
            if (
                start
                and not _ready(pod)
                and status.get("phase") == "Running"
                and (self.pod_may_be_ready is None or self.pod_may_be_ready(pod))
                and now >= durations.parse_time(start) + self.ready_after
            ):
                conditions = [c for c in status.get("conditions") or () if c.get("type") != "Ready"]
                self._write(key, {"status": {"conditions": [*conditions, {"type": "Ready", "status": "True"}]}})

    def _reconcile_deployments(self, now: float) -> None:
        """The Deployment controller's rolling update (``pkg/controller/deployment/rolling.go``): the
                ReplicaSet whose ``pod-template-hash`` matches ``spec.template`` is the new one; it is scaled up
                within ``maxSurge`` and the old ones down within ``maxUnavailable`` (both from
                ``spec.strategy.rollingUpdate``, default 25%: surge rounded up, unavailable down, and at least
                one of them non-zero). ``spec.paused`` stops it where it is (no new ReplicaSet, no scaling: the real
        one still scales proportionally); ``Recreate`` is not emulated. Status follows, :attr:`status_delay` late
                (:meth:`_publish_deployment_status`)."""
        for key, deployment in self._live("apps/v1/deployments"):
            meta, spec = deployment["metadata"], deployment.get("spec") or {}
            if meta.get("deletionTimestamp") or "template" not in spec or spec.get("paused"):
                continue  # paused (``kubectl rollout pause``): no rollout, status still published
            namespace = key[1]
            desired = 1 if spec.get("replicas") is None else int(spec["replicas"])
            template_hash = _template_hash(spec["template"])
            sets = self._owned("apps/v1/replicasets", namespace, meta["uid"])
            new = next(
                (rs for rs in sets if (rs["metadata"].get("labels") or {}).get(HASH_LABEL) == template_hash), None
            )
            olds = [rs for rs in sets if rs is not new]
            surge, unavailable = _rolling_limits(spec, desired)
            replicas = {rs["metadata"]["name"]: int((rs.get("spec") or {}).get("replicas") or 0) for rs in sets}
            available = {rs["metadata"]["name"]: self._rs_counts(rs)[2] for rs in sets}
            if new is None:
                total = sum(replicas.values())
                start = desired if not any(replicas.values()) else max(min(desired + surge - total, desired), 0)
                new = self._new_replicaset(key, deployment, template_hash, start)
                replicas[new["metadata"]["name"]], available[new["metadata"]["name"]] = start, 0
            name_new = new["metadata"]["name"]
            if not any(replicas[rs["metadata"]["name"]] for rs in olds):
                target = {name_new: desired}
            else:
                target = dict(replicas)
                if target[name_new] > desired:
                    target[name_new] = desired
                elif target[name_new] < desired:
                    up = min(desired + surge - sum(target.values()), desired - target[name_new])
                    target[name_new] += max(up, 0)
                min_available = desired - unavailable
                budget = sum(replicas.values()) - min_available - (replicas[name_new] - available[name_new])
                for rs in olds:  # unhealthy old pods first (cleanupUnhealthyReplicas)
                    name = rs["metadata"]["name"]
                    down = min(budget, target[name] - available[name])
                    if budget > 0 and down > 0:
                        target[name] -= down
                        budget -= down
                spare = sum(available.values()) - min_available
                for rs in olds:  # then available ones, oldest first (scaleDownOldReplicaSetsForRollingUpdate)
                    name = rs["metadata"]["name"]
                    down = min(target[name], spare, budget)
                    if down > 0:
                        target[name] -= down
                        spare -= down
                        budget -= down
            for rs in sets if new in sets else [*sets, new]:
                name = rs["metadata"]["name"]
                if name in target and target[name] != replicas[name]:
                    self._write(
                        (kmock.resource("apps/v1/replicasets"), namespace, name), {"spec": {"replicas": target[name]}}
                    )

    def _new_replicaset(
        self, key: Any, deployment: dict[str, Any], template_hash: str, replicas: int
    ) -> dict[str, Any]:
        meta, spec = deployment["metadata"], deployment["spec"]
        template = copy.deepcopy(spec["template"])
        template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = template_hash
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = template_hash
        labels = {**(template["metadata"]["labels"])}
        _, created = self._create(
            kmock.resource("apps/v1/replicasets"),
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{meta['name']}-{template_hash}",
                    "namespace": key[1],
                    "labels": labels,
                    "ownerReferences": [_owner_ref("apps/v1", "Deployment", meta)],
                },
                "spec": {"replicas": replicas, "selector": selector, "template": template},
            },
        )
        return created

    def _rs_counts(self, rs: dict[str, Any]) -> tuple[int, int, int]:
        """(pods, Ready pods, available pods) of a ReplicaSet: its pods not terminating, not finished
        (``minReadySeconds`` is not emulated: Ready is available)."""
        alive = [
            p
            for p in self._owned("v1/pods", rs["metadata"]["namespace"], rs["metadata"]["uid"])
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        ready = sum(1 for p in alive if _ready(p))
        return len(alive), ready, ready

    def _reconcile_replicasets(self, now: float) -> None:
        """The ReplicaSet controller: ``spec.replicas`` pods from ``spec.template``, created
        ``Pending``; a surplus deleted gracefully, not-Ready ones first, then the newest; status
        counts at once (the Deployment's own status is the late one)."""
        pods_res = kmock.resource("v1/pods")
        for key, rs in self._live("apps/v1/replicasets"):
            meta, spec = rs["metadata"], rs.get("spec") or {}
            if meta.get("deletionTimestamp") or "template" not in spec:
                continue  # a test's ReplicaSet with no template only links its pods to their Deployment
            desired = int(spec.get("replicas") or 0)
            alive = [
                p
                for p in self._owned("v1/pods", key[1], meta["uid"])
                if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            surplus = sorted(alive, key=lambda p: (_ready(p), -self._born.get(p["metadata"]["uid"], 0.0)))
            for pod in surplus[: max(len(alive) - desired, 0)]:
                self._delete((pods_res, key[1], pod["metadata"]["name"]), {})
            for _ in range(desired - len(alive)):
                template = copy.deepcopy(spec["template"])
                pod_meta = template.get("metadata") or {}
                pod_meta.update(
                    namespace=key[1],
                    generateName=f"{meta['name']}-",
                    ownerReferences=[_owner_ref("apps/v1", "ReplicaSet", meta)],
                )
                template["metadata"] = pod_meta
                template["status"] = {
                    "phase": "Pending",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                    ],
                }
                self._create(pods_res, template)
            pods, ready, available = self._rs_counts(rs)
            status = {
                "observedGeneration": meta.get("generation", 1),
                "replicas": pods,
                "fullyLabeledReplicas": pods,
                "readyReplicas": ready,
                "availableReplicas": available,
            }
            if any((rs.get("status") or {}).get(k) != v for k, v in status.items()):
                self._write(key, {"status": status})

    def deployment_status(self, key: Any) -> dict[str, Any]:
        """The status the Deployment controller computes now (published :attr:`status_delay` later):
        ``replicas`` = pods of all its ReplicaSets, ``updatedReplicas`` = pods of the new one, Ready
        and available summed (each pod not terminating); a zero count is ``None`` (absent once
        written: the real status omits it)."""
        deployment = self.objects[key].raw
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        template_hash = _template_hash(spec["template"])
        desired = 1 if spec.get("replicas") is None else int(spec["replicas"])
        total = updated = ready = available = 0
        for rs in self._owned("apps/v1/replicasets", key[1], meta["uid"]):
            pods, rs_ready, rs_available = self._rs_counts(rs)
            total, ready, available = total + pods, ready + rs_ready, available + rs_available
            if (rs["metadata"].get("labels") or {}).get(HASH_LABEL) == template_hash:
                updated = pods
        counts = {
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "unavailableReplicas": max(desired - available, 0),
        }
        # ``omitempty``: a zero count is absent from the status, as the API server serializes it.
        return {"observedGeneration": meta.get("generation", 1), **{k: v or None for k, v in counts.items()}}

    def _rolling_out(self, namespace: str) -> tuple[str, ...]:
        names = []
        for key, deployment in self._live("apps/v1/deployments", namespace):
            spec = deployment.get("spec") or {}
            if "template" not in spec:
                continue
            desired = 1 if spec.get("replicas") is None else int(spec["replicas"])
            truth = self.deployment_status(key)
            if any((truth.get(k) or 0) != desired for k in ("replicas", "updatedReplicas", "availableReplicas")):
                names.append(key[2])
        return tuple(names)

    def _publish_deployment_status(self, now: float) -> None:
        """Each Deployment's status as computed :attr:`status_delay` seconds ago: what the real
        controller writes lags the pods (and ``spec``) by its informers and work queue."""
        for key, deployment in self._live("apps/v1/deployments"):
            if "template" not in (deployment.get("spec") or {}):
                continue
            seen = self._seen.setdefault(key, [])
            computed = self.deployment_status(key)
            if not seen or seen[-1][1] != computed:
                seen.append((now, computed))
            due = [i for i, (at, _) in enumerate(seen) if now - at >= self.status_delay]
            if not due:
                continue
            del seen[: due[-1]]
            status = seen[0][1]
            if any((deployment.get("status") or {}).get(k) != v for k, v in status.items()):
                self._write(key, {"status": status})

    def _disruption_controller(self) -> None:
        """Every PodDisruptionBudget's status, recomputed (not at eviction time: an eviction reads
        what was last written here and decrements ``disruptionsAllowed``)."""
        if self.pdb_controller_paused:
            return
        for key, pdb in self._live("policy/v1/poddisruptionbudgets"):
            status = self.pdb_status(pdb)
            if any((pdb.get("status") or {}).get(k) != v for k, v in status.items()):
                self._write(key, {"status": status})

    def _collect_garbage(self, now: float) -> None:
        """The garbage collector, in the background: an object all of whose ``ownerReferences`` name
        removed objects is deleted (gracefully, Background) :attr:`gc_delay` seconds after the last of
        them went. A Deployment's pods therefore go about two delays after it (via the ReplicaSet)."""
        for key, obj in list(self._live_all()):
            if FOREGROUND in (obj["metadata"].get("finalizers") or ()):
                self._foreground(key, obj)
                continue
            owners = [r.get("uid") for r in obj["metadata"].get("ownerReferences") or ()]
            if not owners or obj["metadata"].get("deletionTimestamp"):
                continue
            gone = [self._gone.get(uid) for uid in owners]
            if all(at is not None for at in gone) and now >= max(at for at in gone if at is not None) + self.gc_delay:
                self._delete(key, {})

    def _foreground(self, key: Any, obj: dict[str, Any]) -> None:
        """Foreground deletion: the owner stays (terminating) while it has dependents; each is deleted,
        in the foreground itself when it has dependents of its own (a Deployment's ReplicaSet, whose
        pods then terminate gracefully); once none is left the finalizer goes, and with it the owner."""
        dependents = self._dependents(obj["metadata"].get("uid", ""))
        for dep_key, dep in dependents:
            if not dep["metadata"].get("deletionTimestamp"):
                self._delete(dep_key, {"propagationPolicy": "Foreground"})
        if not dependents:
            kept = [f for f in obj["metadata"].get("finalizers") or () if f != FOREGROUND]
            self._write(key, {"metadata": {"finalizers": kept or None}})

    def _live_all(self) -> list[tuple[Any, dict[str, Any]]]:
        return [(k, o.raw) for k, o in self.objects.items() if not o.deleted]

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

    def _create(self, resource: Any, obj: dict[str, Any], *, admit: bool = True) -> tuple[Any, dict[str, Any]]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        info = self.resources.get(resource, None)
        namespace = meta.get("namespace") if (info is None or info.namespaced) else None
        key = (resource, namespace, meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=f"{meta['name']} already exists")
        if admit and resource in self.schemas:
            obj = self._admit(resource, obj)
            meta = obj["metadata"]
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=str(next(self._rv)), creationTimestamp=self._now(), generation=1
        )
        self._born[meta["uid"]] = self.clock()
        if resource == kmock.resource("v1/pods"):
            obj.setdefault("status", {}).setdefault("phase", "Running")
        if key in self.objects:
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        self._pending.append((resource, "ADDED", copy.deepcopy(obj)))
        return key, obj

    def _write(self, key: Any, patch: Any) -> dict[str, Any]:
        """Apply a merge patch (a dict) or a JSON patch (a list), or store a whole object (``PUT``:
        :meth:`_replace`); admission (:attr:`schemas`) first, ``generation`` bumped on a ``spec``
        change, a new ``resourceVersion``."""
        obj = self.objects[key]
        old = obj.raw
        uid = ((patch.get("metadata") or {}) if isinstance(patch, dict) else {}).get("uid")
        if uid is not None and uid != old["metadata"].get("uid"):  # immutable: a real server says 422
            raise kmock.KubernetesError(status=422, reason="Invalid", message="metadata.uid: field is immutable")
        if isinstance(patch, list):  # JSON patch; a failed ``test`` op is 422, as on a real server
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(old), patch)
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        else:
            new = _merge(copy.deepcopy(old), patch)
        if key[0] in self.schemas:
            new = self._admit(key[0], new, old)
        if key[0] != kmock.resource("v1/pods") and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        obj.history.append(new)
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
        # Background garbage collection: dependents go after their owner, later (_collect_garbage).
        self._gone[raw["metadata"].get("uid", "")] = self.clock()

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
        if options.get("propagationPolicy") == "Orphan":
            self._orphan(meta.get("uid", ""))
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
        elif options.get("propagationPolicy") == "Foreground" and self._dependents(meta.get("uid", "")):
            finalizers = [*(meta.get("finalizers") or ()), FOREGROUND]
            self._write(key, {"metadata": {"deletionTimestamp": self._now(), "finalizers": finalizers}})
        elif meta.get("finalizers"):
            self._write(key, {"metadata": {"deletionTimestamp": self._now()}})
        else:
            self._hard_delete(key)
        return raw

    def _dependents(self, uid: str) -> list[tuple[Any, dict[str, Any]]]:
        """The objects not yet removed (terminating ones included) with an ``ownerReference`` to ``uid``."""
        return [
            (k, o)
            for k, o in self._live_all()
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ())
        ]

    def _orphan(self, uid: str) -> None:
        """``propagationPolicy: Orphan``: the dependents lose their reference to the owner (at once; the
        real garbage collector does it before the owner goes, behind an ``orphan`` finalizer)."""
        for key, obj in self._live_all():
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                kept = [r for r in refs if r.get("uid") != uid]
                self._write(key, {"metadata": {"ownerReferences": kept or None}})

    def _admit(self, resource: Any, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        """The object as its structural schema stores it, or 422 Invalid with every cause (an update
        compared with ``old``, the stored object: see :meth:`schema.Structural.admit`)."""
        admitted, causes = self.schemas[resource].admit(obj, old)
        if causes:
            body = schema_.invalid(
                self.resources[resource].kind or "", resource.group or "", obj["metadata"].get("name", ""), causes
            )
            raise kmock.KubernetesError(status=422, reason="Invalid", message=body["message"], details=body["details"])
        return admitted

    def _replace(self, key: Any, body: dict[str, Any], subresource: str | None) -> dict[str, Any]:
        """``PUT``: the whole object (or its status) replaced; ``metadata.resourceVersion``, when
        sent, must be the stored one (409 otherwise); server-owned metadata kept."""
        stored = self.objects[key].raw
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != stored["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f'Operation cannot be fulfilled on {key[0].plural} "{key[2]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        has_status = "status" in self.resources[key[0]].subresources
        if subresource == "status":
            new = {**stored, "status": body.get("status")}
        else:
            new = {**body, "metadata": {**(body.get("metadata") or {})}}
            if has_status:
                new["status"] = stored.get("status")
            kept = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")
            for field in kept:
                if field in stored["metadata"]:
                    new["metadata"][field] = stored["metadata"][field]
                else:
                    new["metadata"].pop(field, None)
        new = {k: v for k, v in new.items() if v is not None}
        raw = self._write(key, [{"op": "replace", "path": "", "value": new}])
        self._lease_written(key[0], raw)
        return raw

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for resource, kind, raw in pending:
            await self._buses[resource].put({"type": kind, "object": raw})

    async def _handle(self, request: Any) -> Any:
        if self.write_audit is not None:
            self.write_audit(request)
        if self.on_request is not None:
            self.on_request(request)
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
                rolling_out = self._rolling_out(request.namespace)
                code, body = self._evict(request.namespace, request.name, request.data or {})
                self.evictions.append(
                    Eviction(
                        pod=request.name,
                        code=code,
                        at=self.clock(),
                        unsettled=tuple(unsettled),
                        rolling_out=rolling_out,
                        uid=((request.data or {}).get("deleteOptions") or {}).get("preconditions", {}).get("uid", ""),
                    )
                )
                await self._flush()
            return aiohttp.web.json_response(body, status=code)
        if request.resource is not None and request.method == "PUT" and request.name:
            try:
                async with self._lock:
                    key = (request.resource, request.namespace, request.name)
                    if key not in self.objects or self.objects[key].deleted:
                        raise kmock.KubernetesError(
                            status=404, reason="NotFound", message=f"{request.name!r} not found"
                        )
                    replaced = copy.deepcopy(self._replace(key, request.data or {}, request.subresource))
                    await self._flush()
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
            return aiohttp.web.json_response(replaced)
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
        elif request.method == "PUT" and request.name:
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
            for k, raw in self._live("policy/v1/poddisruptionbudgets", namespace)
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
                self._write(pdb_key, {"status": {"disruptionsAllowed": status["disruptionsAllowed"] - 1}})
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
