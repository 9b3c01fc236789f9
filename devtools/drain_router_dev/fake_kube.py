"""A stand-in Kubernetes API for the activator and the front: the port map's ConfigMap (GET),
ModelServices (GET, and merge patches of their status subresource, with the ``resourceVersion``
checked; a service in ``forbidden`` answers 403 to both, as RBAC would), one list of pods (filtered
by namespace and by the selector for pods that carry labels) and one of EndpointSlices (filtered the
same way), recording every call (:class:`FakeKube`, served by :func:`kube_api`). What the activator
and the front read of the API and nothing more: the tests, the bench and the demo point
``drain-router activator --kube-api`` (and ``drain-router front --kube-api``) at it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

NS, NAME = "models", "llama"
"""The namespace and name of :func:`modelservice` unless given."""
PORTS_NS, PORTS_NAME = "drain-router", "drain-router-activator-ports"
"""The port map's ConfigMap (``--ports-configmap PORTS_NS/PORTS_NAME``)."""
PORTS_CONFIGMAP = f"{PORTS_NS}/{PORTS_NAME}"


def modelservice(
    *,
    port: int,
    cold_start: float | None = None,
    rv: int = 1,
    namespace: str = NS,
    name: str = NAME,
) -> dict[str, Any]:
    """A ModelService scaled to zero whose pods' routers listen on ``port`` (traffic, where the
    activator asks ``/readyz`` and relays); with ``cold_start``, an earlier wake that took that long."""
    lifecycle: dict[str, Any] = {"phase": "ScaledToZero", "replicasBeforeZero": 1}
    if cold_start is not None:
        lifecycle |= {
            "coldStartSeconds": cold_start,
            "wakeRequestedAt": "2026-01-01T00:00:00Z",
            "awokenAt": "2026-01-01T00:01:00Z",
        }
    return {
        "apiVersion": "drainrouter.dev/v1alpha1",
        "kind": "ModelService",
        "metadata": {"namespace": namespace, "name": name, "resourceVersion": str(rv)},
        "spec": {
            "podSelector": {"matchLabels": {"app": name, "tier": "model"}},
            "workload": {"kind": "Deployment", "name": name},
            "router": {"port": port, "adminPort": 9091},
        },
        "status": {"lifecycle": lifecycle},
    }


def pod(
    ip: str, name: str, *, phase: str = "Running", namespace: str = NS, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as the pods list returns it: its phase and IP; with ``labels``, listed only for a
    selector they match (without, for any)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z"}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def endpointslice(
    service: str,
    addresses: list[str],
    *,
    name: str | None = None,
    managed_by: str = "endpointslice-controller.k8s.io",
    namespace: str = NS,
) -> dict[str, Any]:
    """An EndpointSlice of the Service ``service`` listing ``addresses``, each its own ready endpoint;
    ``managed_by`` the controller that wrote it (``drain-router.dev``: the activator's)."""
    labels = {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": managed_by}
    return {
        "metadata": {"name": name or service, "namespace": namespace, "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}} for address in addresses],
    }


def _selected(pod: dict[str, Any], namespace: str, selector: str) -> bool:
    meta = pod["metadata"]
    if meta.get("namespace", namespace) != namespace:
        return False
    labels = meta.get("labels")
    if labels is None:
        return True
    wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
    return all(labels.get(k) == v for k, v in wanted.items())


@dataclasses.dataclass
class FakeKube:
    services: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The pods of the one service, as the list returns them."""
    endpointslices: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The EndpointSlices, as the list returns them (by namespace and label selector)."""
    conflicts: int = 0
    """The next N status patches answer 409 (another writer came first: the version moves on)."""
    patches: list[tuple[str, dict[str, Any], int]] = dataclasses.field(default_factory=list)
    """Every status patch: its content type, its body, the status answered."""
    reads: int = 0
    selectors: list[str] = dataclasses.field(default_factory=list)
    ports: dict[str, str] | None = None
    """The port map's ``data`` (None: the ConfigMap does not exist)."""
    forbidden: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """ModelServices the activator may not read or patch (403, as RBAC answers)."""
    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """Every call, ``(method, path)``, in order."""
    authorizations: list[str | None] = dataclasses.field(default_factory=list)
    """Every call's ``Authorization`` header (None without one), in the order of :attr:`calls`."""
    url: str = ""

    def calls_to(self, method: str, fragment: str) -> int:
        """The calls so far with ``method`` whose path contains ``fragment``."""
        return sum(1 for m, path in self.calls if m == method and fragment in path)

    @web.middleware
    async def record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.calls.append((request.method, request.path))
        self.authorizations.append(request.headers.get("Authorization"))
        return await handler(request)

    async def configmap(self, request: web.Request) -> web.Response:
        if (request.match_info["ns"], request.match_info["name"]) != (PORTS_NS, PORTS_NAME) or self.ports is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        meta = {"namespace": PORTS_NS, "name": PORTS_NAME}
        return web.json_response({"kind": "ConfigMap", "metadata": meta, "data": dict(self.ports)})

    def _forbidden(self, request: web.Request) -> web.Response | None:
        if (request.match_info["ns"], request.match_info["name"]) not in self.forbidden:
            return None
        return web.json_response({"kind": "Status", "reason": "Forbidden", "code": 403}, status=403)

    def accepted(self) -> list[dict[str, Any]]:
        return [body for _, body, code in self.patches if code == 200]

    async def get(self, request: web.Request) -> web.Response:
        self.reads += 1
        if (refused := self._forbidden(request)) is not None:
            return refused
        obj = self.services.get((request.match_info["ns"], request.match_info["name"]))
        if obj is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(obj)

    async def patch(self, request: web.Request) -> web.Response:
        obj = self.services.get((request.match_info["ns"], request.match_info["name"]))
        body = await request.json()
        code = 200
        if self._forbidden(request) is not None:
            code = 403
        elif obj is None:
            code = 404
        elif self.conflicts:
            self.conflicts -= 1
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            code = 409
        elif body.get("metadata", {}).get("resourceVersion") != obj["metadata"]["resourceVersion"]:
            code = 409
        else:
            obj["status"]["lifecycle"].update(body["status"]["lifecycle"])
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.patches.append((request.content_type, body, code))
        return web.json_response(obj if code == 200 else {"kind": "Status", "code": code}, status=code)

    async def list_pods(self, request: web.Request) -> web.Response:
        selector = request.query.get("labelSelector", "")
        self.selectors.append(selector)
        items = [p for p in self.pods if _selected(p, request.match_info["ns"], selector)]
        return web.json_response({"kind": "PodList", "items": items})

    async def list_endpointslices(self, request: web.Request) -> web.Response:
        selector = request.query.get("labelSelector", "")
        items = [s for s in self.endpointslices if _selected(s, request.match_info["ns"], selector)]
        return web.json_response({"kind": "EndpointSliceList", "items": items})


@contextlib.asynccontextmanager
async def kube_api() -> AsyncIterator[FakeKube]:
    """A :class:`FakeKube` served on a free loopback port (its ``url``) until the block ends."""
    kube = FakeKube()
    app = web.Application(middlewares=[kube.record])
    path = "/apis/drainrouter.dev/v1alpha1/namespaces/{ns}/modelservices/{name}"
    app.router.add_get(path, kube.get)
    app.router.add_patch(path + "/status", kube.patch)
    app.router.add_get("/api/v1/namespaces/{ns}/pods", kube.list_pods)
    app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", kube.configmap)
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", kube.list_endpointslices)
    async with serving(app, "127.0.0.1") as url:
        kube.url = url
        yield kube


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str) -> AsyncIterator[str]:
    """``app`` on a free port of ``host`` (its base URL) until the block ends."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
