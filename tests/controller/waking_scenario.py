"""Building blocks of the waking tests (``--activator-service``): a ModelService whose route has
rules to switch, a recorder of every route and Deployment write with the cluster as it found it, and
the activator's wake request."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import kmock

from drain_router.decisions import activator, route_switch

from .conftest import MSVC, NAMESPACE, eventually
from .rules_scenario import deployment, make_service, ready_pods, status

ACTIVATOR = route_switch.ActivatorService(namespace="gw", name="activator", port=8012)
AT_ACTIVATOR = [{"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": 8012}]
RULES = [
    {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "backendRefs": [{"name": "llama", "port": 8080}],
        "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-a", "value": "1"}]}}
        ],
    },
    {"backendRefs": [{"name": "llama", "port": 8080, "weight": 1}]},
]
FAST = {"idle_recheck_secs": 0.2, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1, "activator_service": ACTIVATOR}
ROUTES = "httproutes"


@dataclasses.dataclass
class Write:
    """One write of the route or the Deployment as the emulator received it, with the cluster then."""

    plural: str
    data: Any
    ready_pods: int
    route_rules: list[Any]


class Recorder:
    def __init__(self, emu: Any, at_activator: list[dict[str, Any]] | None = None) -> None:
        self.emu = emu
        self.at_activator = AT_ACTIVATOR if at_activator is None else at_activator
        """A rule's backendRefs while it points at the activator."""
        self.writes: list[Write] = []
        emu.on_request = self.seen

    def seen(self, request: Any) -> None:
        plural = request.resource.plural if request.resource is not None else None
        if plural in (ROUTES, "deployments") and request.method == "PATCH" and request.subresource is None:
            self.writes.append(
                Write(
                    plural,
                    request.data,
                    len(ready_pods(self.emu)),
                    (route(self.emu).get("spec") or {}).get("rules") or [],
                )
            )

    def of(self, plural: str) -> list[Write]:
        return [w for w in self.writes if w.plural == plural]

    def check_never_at_an_empty_service(self) -> None:
        """Every route write that points a rule at the model Service came while a pod was Ready, and
        every scale to 0 came while the route pointed at the activator."""
        for write in self.writes:
            if write.plural == ROUTES:
                rules = write.data["spec"]["rules"]
                if any(r.get("backendRefs") != self.at_activator for r in rules):
                    assert write.ready_pods > 0, f"the route pointed at the Service with no Ready pod: {write.data}"
            elif write.data.get("spec", {}).get("replicas") == 0:
                assert all(r.get("backendRefs") == self.at_activator for r in write.route_rules), (
                    "scaled to 0 with the route at the Service"
                )


def route(emu: Any) -> dict[str, Any]:
    obj = emu.get(f"gateway.networking.k8s.io/v1/{ROUTES}", NAMESPACE, "llama")
    assert obj is not None
    return obj


def lifecycle(emu: Any) -> dict[str, Any]:
    return dict(status(emu).get("lifecycle") or {})


async def service(cluster: Any, routers: Any, *, timeout: int = 600) -> Recorder:
    """Two Ready pods, idle; ScaleToZero after 1 s; the route with :data:`RULES`."""
    emu, server = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}], "activationTimeoutSeconds": timeout}
    await make_service(emu, admin_port=routers.port, replicas=2, lifecycle=rules)
    response = await server.client.patch(
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/{ROUTES}/llama",
        json={"spec": {"rules": RULES}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods")
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


def route_reads(emu: Any) -> list[Any]:
    return [
        r
        for r in emu._requests
        if r.action == kmock.action.FETCH and r.resource is not None and r.resource.plural == ROUTES
    ]


def wakes(op: Any, outcome: str) -> float:
    return float(
        op.ctx.metrics.registry.get_sample_value("drain_router_controller_wakes_total", {"outcome": outcome}) or 0
    )
