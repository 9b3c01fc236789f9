"""Scale to zero and wake on a request, every part real but the API server: the operator against the
emulator, a real ``drain-router activator`` process reading and patching that same emulator, and
process-backed pods (:mod:`process_pods`: a real ``drain-router serve`` per pod, on its own loopback
podIP, started when the emulator's Deployment controller creates the pod and SIGTERMed when it is
deleted) in front of a model server that records the order requests reach it. The route is not
served by a gateway here: the test sends to the activator with the header the route's filter sets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drain_router.decisions import activation, route_switch
from drain_router_dev import process as process_
from tests.activator import stand_ins

from . import process_pods
from .conftest import NAMESPACE, eventually
from .rules_scenario import deployment, make_service, ready_pods
from .scenario import events
from .waking_scenario import ROUTES, RULES, Recorder, lifecycle, route

pytestmark = pytest.mark.slow

FAST = {"idle_recheck_secs": 0.2, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1, "idle_probe_timeout_secs": 1.0}
HELD = 100


@pytest.fixture
async def model() -> AsyncIterator[stand_ins.Model]:
    async with stand_ins.model_server() as m:
        yield m


@pytest.fixture
async def kubelet(cluster: Any, model: stand_ins.Model) -> AsyncIterator[process_pods.ProcessKubelet]:
    emu, _ = cluster
    emu.ready_after = 0.0
    kubelet = process_pods.ProcessKubelet(
        emu,
        upstream=model.url,
        admin_port=process_.free_port(),
        main_port=process_.free_port(),
        router_args=("--shutdown-drain-secs", "0", "--termination-grace-secs", "30"),
    )
    try:
        yield kubelet
    finally:
        await kubelet.close()


async def _service(cluster: Any, kubelet: process_pods.ProcessKubelet, *, timeout: int = 120) -> None:
    """One pod; ScaleToZero after 1 idle second; the route's rules :data:`RULES`."""
    emu, server = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}], "activationTimeoutSeconds": timeout}
    await make_service(
        emu, exits_after=None, admin_port=kubelet.admin_port, router_port=kubelet.main_port, lifecycle=rules
    )
    response = await server.client.patch(
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/{ROUTES}/llama",
        json={"spec": {"rules": RULES}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()


async def _hold(port: int, id_: str, header: str, wait: float = 0) -> tuple[int, Any]:
    status, _, body = await _hold_answer(port, id_, header, wait)
    return status, body


async def _hold_answer(port: int, id_: str, header: str, wait: float = 0) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{port}/hold?id={id_}&wait={wait}",
            data=f"request {id_}",
            headers={route_switch.HEADER: header},
            timeout=aiohttp.ClientTimeout(total=120),
        ) as response:
            return response.status, dict(response.headers), await response.json(content_type=None)


async def _direct(ip: str, port: int, id_: str, wait: float = 0) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://{ip}:{port}/hold?id={id_}&wait={wait}", timeout=aiohttp.ClientTimeout(total=60)
        ) as response:
            return response.status, await response.json(content_type=None)


def _header(emu: Any) -> str:
    """The value the route's RequestHeaderModifier sets, as a gateway would send it."""
    (value,) = {
        h["value"]
        for rule in route(emu)["spec"]["rules"]
        for f in rule.get("filters") or ()
        if f["type"] == "RequestHeaderModifier"
        for h in f["requestHeaderModifier"].get("set") or ()
        if h["name"] == route_switch.HEADER
    }
    return value


async def _asleep(emu: Any, kubelet: process_pods.ProcessKubelet) -> None:
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero", timeout=30)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero")
    await eventually(
        lambda: not ready_pods(emu) and all(p.exit_code is not None for p in kubelet.pods.values()),
        what="every pod's router drained and exited",
        timeout=30,
    )


async def test_requests_to_a_sleeping_service_wake_it_and_are_answered_in_arrival_order(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """1. one pod serves a request, then is idle 1 s. Result: the route points at the activator,
    then the Deployment goes to 0 and the pod's router drains and exits 0. 2. the pods' cold start
    held back; 100 requests sent one after another to the activator, each held before the next is
    sent. Result: one wake asked for (phase Waking), nothing reaches the model server. 3. the cold
    start ends. Result: all 100 answered 200 by the model server, each with its own body, none twice;
    the route's rules exactly as before the sleep, phase Active, coldStartSeconds recorded, the
    activator counted one activation. At no write did the route point at the model Service without
    a Ready pod. 4. idle again. Result: scaled to zero again."""
    emu, server = cluster
    async with stand_ins.activator(
        str(server.url).rstrip("/"), "--activation-timeout-secs", "120", "--queue-size", str(HELD)
    ) as act:
        assert act.port is not None and act.admin_port is not None
        service = route_switch.ActivatorService(namespace="gw", name="activator", port=act.port)
        await _service(cluster, kubelet)
        recorder = Recorder(
            emu, [{"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": act.port}]
        )
        (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
        status, body = await _direct(pod["status"]["podIP"], kubelet.main_port, "warm")
        assert (status, body["id"]) == (200, "warm")  # served > 0: the idle clock may start
        op = await start_operator(**FAST, activator_service=service)
        await _asleep(emu, kubelet)
        first = kubelet.by_name(pod["metadata"]["name"])
        assert first.exit_code == 0
        header = _header(emu)
        assert header == f"{NAMESPACE}/llama"

        kubelet.cold_start.clear()
        sent = []
        for i in range(HELD):
            sent.append(asyncio.ensure_future(_hold(act.port, str(i), header)))
            await stand_ins.wait_held(act.admin_port, i + 1, timeout=15, service=header)
        assert model.arrived == ["warm"], "nothing reaches the model server while it sleeps"
        await eventually(lambda: lifecycle(emu).get("phase") == "Waking", what="phase Waking")
        assert deployment(emu)["spec"]["replicas"] == 1
        kubelet.cold_start.set()

        answers = await asyncio.wait_for(asyncio.gather(*sent), 90)
        assert [(s, b["id"], b["body"]) for s, b in answers] == [(200, str(i), f"request {i}") for i in range(HELD)]
        # Handed on oldest first (the activator's own test proves that order at a pod with nothing in
        # between); here each goes on its own connection through the pod's router, so two handed on
        # in the same moment may reach the model server in either order. All of them do, once.
        assert model.arrived[0] == "warm" and sorted(model.arrived[1:], key=int) == [str(i) for i in range(HELD)]
        await eventually(lambda: len(recorder.of(ROUTES)) >= 2, what="the route pointed back", timeout=30)
        back = recorder.of(ROUTES)[1].data["spec"]["rules"]
        assert [{k: r[k] for k in ("backendRefs", "filters") if k in r} for r in back] == [
            {k: r[k] for k in ("backendRefs", "filters") if k in r} for r in RULES
        ]
        record = lifecycle(emu)
        assert record["coldStartSeconds"] > 0 and record["awokenAt"] and record["wakeRequestedAt"]
        assert record["phase"] in ("Active", "ScaledToZero")  # Active, or already asleep again
        activations = await stand_ins.metric(act.admin_port, "drain_router_activations_total")
        assert sum(activations.values()) == 1
        assert await stand_ins.held(act.admin_port, header) == 0

        await _asleep(emu, kubelet)  # the next idle period: asleep again, through the activator again
        assert all(r["backendRefs"] == recorder.at_activator for r in route(emu)["spec"]["rules"])
        assert len(recorder.of(ROUTES)) == 3, "to the activator, back, to the activator again"
        assert [w.data["spec"]["replicas"] for w in recorder.of("deployments")] == [0, 1, 0]
        recorder.check_never_at_an_empty_service()
        assert op.ctx is not None


async def test_a_request_in_flight_on_the_last_pod_finishes_whatever_the_sleep_does(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """1. one pod served a request and is idle 2. the moment the route points at the activator, a
    2 s request starts on the pod (a client that still had the old route). Result: it is answered
    200 whole: either the sleep went on (the pod's router drained it and exited 0) or the busy pod
    cancelled it (the route pointed back once the router answered); never a route at the Service
    without a Ready pod."""
    emu, _ = cluster
    service = route_switch.ActivatorService(namespace="gw", name="activator", port=process_.free_port())
    await _service(cluster, kubelet)
    recorder = Recorder(
        emu, [{"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": service.port}]
    )
    (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
    ip = pod["status"]["podIP"]
    assert (await _direct(ip, kubelet.main_port, "warm"))[0] == 200
    await start_operator(**FAST, activator_service=service)
    await eventually(lambda: recorder.of(ROUTES), what="the route pointed at the activator", timeout=30)
    status, body = await _direct(ip, kubelet.main_port, "late", wait=2)
    assert (status, body["id"]) == (200, "late")
    process = kubelet.by_name(pod["metadata"]["name"])
    if process.sigterm_sent:
        await eventually(lambda: process.exit_code is not None, what="the router's exit", timeout=30)
        assert process.exit_code == 0
    recorder.check_never_at_an_empty_service()


async def test_a_wake_that_never_gets_a_ready_pod_answers_503_and_leaves_the_service_asleep(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """activationTimeout 3 s on both sides; the woken pod's cold start never ends. Result: the held
    request is answered 503 with Retry-After from the last cold start (none observed yet: the
    default) and never reaches the model server; the controller scales back to 0 with a Warning
    WakeFailed, the route left at the activator, phase ScaledToZero."""
    emu, server = cluster
    async with stand_ins.activator(str(server.url).rstrip("/"), "--activation-timeout-secs", "3") as act:
        assert act.port is not None
        service = route_switch.ActivatorService(namespace="gw", name="activator", port=act.port)
        await _service(cluster, kubelet, timeout=3)
        at_activator = [{"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": act.port}]
        recorder = Recorder(emu, at_activator)
        (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
        assert (await _direct(pod["status"]["podIP"], kubelet.main_port, "warm"))[0] == 200
        await start_operator(**FAST, activator_service=service)
        await _asleep(emu, kubelet)
        kubelet.cold_start.clear()  # for good: no pod of the wake ever starts

        status, headers, body = await _hold_answer(act.port, "late", _header(emu))
        assert status == 503 and headers["Retry-After"] == str(activation.retry_after(None)), (status, headers, body)
        assert model.arrived == ["warm"]
        await eventually(lambda: ("Warning", "WakeFailed") in events(emu), what="a WakeFailed Warning", timeout=30)
        await eventually(
            lambda: lifecycle(emu).get("phase") == "ScaledToZero" and deployment(emu)["spec"]["replicas"] == 0,
            what="asleep again",
        )
        assert all(r["backendRefs"] == at_activator for r in route(emu)["spec"]["rules"])
        assert [w.data["spec"]["replicas"] for w in recorder.of("deployments")] == [0, 1, 0]
        recorder.check_never_at_an_empty_service()
