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

Not emulated: admission, OpenAPI validation and defaulting (the CRD schema is checked separately),
optimistic concurrency on ``resourceVersion`` in patches, field selectors, watch bookmarks and
``resourceVersion`` resumption, RBAC, strategic merge patch.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
import uuid
from typing import Any

import attrs
import jsonpatch
import kmock

from router.decisions import durations

#: Seconds after its deletion that a simulated container exits by itself (its drain/preStop took this
#: long); without it the container ignores SIGTERM and is killed at the end of its grace.
EXITS_AFTER = "emulator.test/exits-after-secs"

RESOURCES = {
    "v1/pods": ("Pod", True, set()),
    "v1/nodes": ("Node", False, set()),
    "v1/services": ("Service", True, set()),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, set()),
    "apps/v1/deployments": ("Deployment", True, {"status"}),
    "gateway.networking.k8s.io/v1/httproutes": ("HTTPRoute", True, {"status"}),
}


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


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    clock: Any = time.time
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _faults: dict[Any, tuple[int, str, str]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for path, (kind, namespaced, subresources) in RESOURCES.items():
            self.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, subresources=subresources,
                                                      verbs={"get", "list", "watch", "create", "patch", "delete"})

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

    def heal(self) -> None:
        self._faults.clear()

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
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (node.get("status") or {}).get("conditions") or ())

    def _now(self) -> str:
        return durations.format_time(self.clock())

    _pending: list[Any] = attrs.field(factory=list, init=False)

    def _create(self, resource: Any, obj: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        info = self.resources[resource] if resource in self.resources else None
        namespace = meta.get("namespace") if (info is None or info.namespaced) else None
        key = (resource, namespace, meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=f"{meta['name']} already exists")
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._rv)),
                    creationTimestamp=self._now(), generation=1)
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
            obj.patch(patch)
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
            raise kmock.KubernetesError(status=409, reason="Conflict",
                                        message=f"Precondition failed: UID in precondition: {pre['uid']}, "
                                                f"UID in object meta: {meta.get('uid')}")
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
        if fault is not None:
            status, reason, message = fault
            return await self._render_error(kmock.KubernetesError(status=status, reason=reason, message=message))
        if request.resource is not None and action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            try:
                async with self._lock:
                    self._mutate(request)
                    await self._flush()
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        return await kmock.KubernetesScaffold._handle(self, request)

    def _mutate(self, request: Any) -> None:
        resource, namespace, name = request.resource, request.namespace, request.name
        if request.action == kmock.action.CREATE:
            obj = request.data
            if namespace:
                obj.setdefault("metadata", {})["namespace"] = namespace
            self._create(resource, obj)
            return
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{resource} {name!r} not found")
        if request.action == kmock.action.DELETE:
            self._delete(key, request.data if isinstance(request.data, dict) else {})
            return
        patch = request.data
        has_status = resource in self.resources and "status" in self.resources[resource].subresources
        if isinstance(patch, dict):
            if request.subresource == "status":
                patch = {"status": patch.get("status")} if "status" in patch else {}
            elif has_status:
                patch = {k: v for k, v in patch.items() if k != "status"}
        elif isinstance(patch, list):
            on_status = [op for op in patch if op.get("path", "").startswith("/status")]
            patch = on_status if request.subresource == "status" else (
                [op for op in patch if op not in on_status] if has_status else patch)
        self._write(key, patch)

    async def _serve_list(self, request: Any) -> Any:
        selector = (request.params or {}).get("labelSelector")
        async with self._lock:
            items = [copy.deepcopy(obj.raw) for (res, ns, _), obj in self.objects.items()
                     if res == request.resource and not obj.deleted
                     and (request.namespace is None or ns == request.namespace)]
        if selector:
            items = [i for i in items if _selector_matches(selector, (i["metadata"].get("labels") or {}))]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": str(next(self._rv))},
                "items": items}
