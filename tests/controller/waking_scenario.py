"""Building blocks of the waking tests (``--activator-service``): a ModelService whose workload has a
Service for the activator to become an endpoint of, a stand-in for the activator's pods (their
EndpointSlice and their ``/admin/ports``), a recorder of every Deployment and EndpointSlice write
with the cluster as it found it, and the activator's wake request."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
from aiohttp import web

from drain_router.controller import probe
from drain_router.decisions import activator, service_ports, wake_endpoints
from drain_router_dev import process as process_

from .conftest import MSVC, NAMESPACE, eventually
from .emulator import MORE_GATEWAY_API
from .rules_scenario import deployment, make_service, ready_pods, status
from .scenario import OWNED

ACTIVATOR_NAMESPACE = "gw"
ACTIVATOR = wake_endpoints.ActivatorService(namespace=ACTIVATOR_NAMESPACE, name="activator")
ACTIVATOR_IPS = ("127.0.0.200", "127.0.0.201")
ACTIVATOR_LABELS = {"app.kubernetes.io/component": "activator"}
CONFIGMAP = "v1/configmaps"
SLICES = "discovery.k8s.io/v1/endpointslices"
POLICIES = "networking.k8s.io/v1/networkpolicies"
SLICE = "llama-drain-router"
FAST = {"idle_recheck_secs": 0.2, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1, "activator_service": ACTIVATOR}
SERVICE_PORTS = [
    {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
    {"name": "grpc", "port": 8081, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
]
USERS = (
    "httproutes",
    "grpcroutes",
    "services",
    "referencegrants",
)
"""The user's objects the wake never writes."""
RULES = [
    {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "backendRefs": [{"name": "llama", "port": 8080}],
    }
]


class StandInActivator:
    """The activator's pods, as the controller sees them: its Service and EndpointSlice in
    :data:`ACTIVATOR_NAMESPACE` (ready endpoints at :data:`ACTIVATOR_IPS`), and each pod's
    ``GET /admin/ports`` answering the ports of the emulator's port map, as an activator that has
    polled it (``listening``: what it answers instead, per IP; ``None``: refuse, 503)."""

    def __init__(self, emu: Any, port: int) -> None:
        self.emu = emu
        self.port = port
        self.answers: dict[str, Any] = {}
        self.asked: list[str] = []

    def ports(self) -> dict[str, str]:
        cm = self.emu.get(CONFIGMAP, ACTIVATOR_NAMESPACE, ACTIVATOR.configmap)
        return dict(service_ports.render(service_ports.parse((cm or {}).get("data"))))

    async def _ports(self, request: web.Request) -> web.Response:
        ip = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        self.asked.append(ip)
        if ip in self.answers:
            body = self.answers[ip]
            if body is None:
                return web.Response(status=503)
            return web.json_response(body)
        return web.json_response({"ports": self.ports()})

    async def set_endpoints(self, ips: tuple[str, ...]) -> None:
        """The activator Service's EndpointSlice, as the EndpointSlice controller writes it."""
        body = {
            "metadata": {
                "name": "activator-x1",
                "namespace": ACTIVATOR_NAMESPACE,
                "labels": {"kubernetes.io/service-name": "activator"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips],
            "ports": [{"name": "admin", "port": self.port, "protocol": "TCP"}],
        }
        if self.emu.get(SLICES, ACTIVATOR_NAMESPACE, "activator-x1") is None:
            await self.emu.put(SLICES, body)
        else:
            async with self.emu._lock:
                key = self.emu.key(SLICES, ACTIVATOR_NAMESPACE, "activator-x1")
                self.emu._write(key, [{"op": "replace", "path": "/endpoints", "value": body["endpoints"]}])
                await self.emu._flush()


@contextlib.asynccontextmanager
async def stand_in_activator(emu: Any) -> AsyncIterator[StandInActivator]:
    stand_in = StandInActivator(emu, process_.free_port())
    app = web.Application()
    app.router.add_get(probe.PORTS_PATH, stand_in._ports)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        for ip in ACTIVATOR_IPS:
            await web.TCPSite(runner, ip, stand_in.port).start()
        await emu.put(
            "v1/services",
            {
                "metadata": {"name": "activator", "namespace": ACTIVATOR_NAMESPACE},
                "spec": {"selector": ACTIVATOR_LABELS, "ports": [{"name": "admin", "port": stand_in.port}]},
            },
        )
        await stand_in.set_endpoints(ACTIVATOR_IPS)
        yield stand_in
    finally:
        await runner.cleanup()


def fast(stand_in: StandInActivator, **more: Any) -> dict[str, Any]:
    return {**FAST, "activator_admin_port": stand_in.port, **more}


@dataclasses.dataclass
class Write:
    """One write of the Deployment or of an EndpointSlice as the emulator received it, with the
    cluster then."""

    plural: str
    method: str
    name: str
    data: Any
    ready_pods: int
    activator_ready: bool
    """The activator slice existed with a ready endpoint."""
    at: float = dataclasses.field(default_factory=time.time)
    """When the emulator received it."""


class Recorder:
    def __init__(self, emu: Any) -> None:
        self.emu = emu
        self.writes: list[Write] = []
        self.user_writes: list[str] = []
        """Every write the controller sent to one of :data:`USERS`."""
        emu.on_request = self.seen

    def seen(self, request: Any) -> None:
        plural = request.resource.plural if request.resource is not None else None
        method = str(getattr(request.method, "value", request.method))
        if request.headers.get("User-Agent", "").startswith("kmock/") or method in ("GET",):
            return
        if plural in USERS:
            self.user_writes.append(f"{method} {plural}/{request.name}")
        if plural in ("deployments", "endpointslices") and request.subresource is None:
            self.writes.append(
                Write(
                    plural,
                    method,
                    request.name or "",
                    request.data,
                    len(ready_pods(self.emu)),
                    activator_ready(self.emu),
                )
            )

    def of(self, plural: str) -> list[Write]:
        return [w for w in self.writes if w.plural == plural]

    def scales(self) -> list[int]:
        return [w.data["spec"]["replicas"] for w in self.of("deployments")]

    def check_always_an_endpoint(self) -> None:
        """Every scale to 0 came while the activator slice was there with a ready endpoint, and every
        removal of it came while a model pod was Ready."""
        for write in self.writes:
            if write.plural == "deployments" and write.data.get("spec", {}).get("replicas") == 0:
                assert write.activator_ready, "scaled to 0 with no activator endpoint on the Service"
            if write.plural == "endpointslices" and write.method == "DELETE":
                assert write.ready_pods > 0, "the activator's endpoints removed with no Ready pod"


def activator_slice(emu: Any) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = emu.get(SLICES, NAMESPACE, SLICE)
    return obj


def activator_ready(emu: Any) -> bool:
    obj = activator_slice(emu)
    return obj is not None and bool(wake_endpoints.ready_addresses([obj]))


def lifecycle(emu: Any) -> dict[str, Any]:
    return dict(status(emu).get("lifecycle") or {})


async def service(cluster: Any, routers: Any, *, timeout: int = 600, replicas: int = 2) -> Recorder:
    """Two Ready pods, idle; ScaleToZero after 1 s; the workload's Service ``llama`` (HTTP and gRPC
    ports) beside the Deployment; an HTTPRoute, a GRPCRoute and a ReferenceGrant of the user's."""
    emu, server = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}], "activationTimeoutSeconds": timeout}
    await make_service(emu, admin_port=routers.port, replicas=replicas, lifecycle=rules)
    emu.serve(MORE_GATEWAY_API)
    await emu.put(
        "v1/services",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED},
            "spec": {"selector": {"app.kubernetes.io/instance": "llama"}, "ports": SERVICE_PORTS},
        },
    )
    await emu.put(
        "gateway.networking.k8s.io/v1/grpcroutes",
        {"metadata": {"name": "llama-grpc", "namespace": NAMESPACE, "labels": OWNED}, "spec": {"rules": []}},
    )
    await emu.put(
        "gateway.networking.k8s.io/v1beta1/referencegrants",
        {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED}, "spec": {"from": [], "to": []}},
    )
    await own_the_service(server)
    response = await server.client.patch(
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/httproutes/llama",
        json={"spec": {"rules": RULES}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: len(ready_pods(emu)) == replicas, what=f"{replicas} Ready pods")
    return Recorder(emu)


async def asleep(emu: Any) -> None:
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero")
    await eventually(lambda: not ready_pods(emu), what="no Ready pod", timeout=10)


async def ask_for_a_wake(server: kmock.Server, emu: Any) -> float:
    """As the activator does: a merge patch of the status subresource with the resourceVersion read; a
    409 (the controller wrote in between) means read again and ask again."""
    for _ in range(20):
        obj = emu.get(MSVC, NAMESPACE, "llama")
        now = time.time()
        patch = activator.wake_patch(now, obj["metadata"]["resourceVersion"])
        response = await server.client.patch(
            f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/modelservices/llama/status",
            json=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status != 409:
            assert response.status == 200, await response.text()
            return now
    raise AssertionError("the wake request conflicted 20 times")


async def own_the_service(server: kmock.Server) -> None:
    """The ModelService ``llama`` names the Service ``llama`` in its workload, beside the Deployment."""
    response = await server.client.patch(
        f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/modelservices/llama",
        json={
            "spec": {
                "workload": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                    {"apiVersion": "v1", "kind": "Service", "name": "llama"},
                ]
            }
        },
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()


def slice_reads(emu: Any) -> list[Any]:
    return [
        r
        for r in emu._requests
        if r.action == kmock.action.LIST and r.resource is not None and r.resource.plural == "endpointslices"
    ]


def wakes(op: Any, outcome: str) -> float:
    return float(
        op.ctx.metrics.registry.get_sample_value("drain_router_controller_wakes_total", {"outcome": outcome}) or 0
    )
