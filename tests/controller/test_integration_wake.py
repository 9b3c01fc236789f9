"""Scale to zero and wake on a request, every part real but the API server: the operator against the
emulator, a real ``drain-router activator`` process reading and patching that same emulator, and
process-backed pods (:mod:`process_pods`: a real ``drain-router serve`` per pod, on its own loopback
podIP, started when the emulator's Deployment controller creates the pod and SIGTERMed when it is
deleted) in front of a model server that records the order requests reach it. No gateway and no
kube-proxy here: the test sends where the activator's EndpointSlice says (the activator pod's address,
127.0.0.1, on the port the controller assigned to the service). The in-flight test runs against a
stand-in for the activator's ``/admin/ports``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drain_router.decisions import activation, wake_endpoints
from drain_router_dev import process as process_
from tests.activator import stand_ins

from . import process_pods
from .conftest import NAMESPACE, eventually
from .rules_scenario import deployment, make_service, ready_pods
from .scenario import OWNED, events
from .waking_scenario import (
    ACTIVATOR,
    ACTIVATOR_NAMESPACE,
    SLICES,
    Recorder,
    StandInActivator,
    activator_slice,
    lifecycle,
    own_the_service,
    stand_in_activator,
)

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


HOLD_LIMIT_SECS = 240
"""The activation timeouts (the activator's and the ModelService's) and the clients' own: far past
how long holding the requests one by one takes on a busy machine (14 s alone, 46 s at a load of 10 on
2 cores), so that only a wake that never comes can reach them."""


async def _service(cluster: Any, kubelet: process_pods.ProcessKubelet, *, timeout: int = HOLD_LIMIT_SECS) -> None:
    """One pod; ScaleToZero after 1 idle second; the workload's Service ``llama`` with its HTTP port."""
    emu, server = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}], "activationTimeoutSeconds": timeout}
    await make_service(
        emu, exits_after=None, admin_port=kubelet.admin_port, router_port=kubelet.main_port, lifecycle=rules
    )
    await emu.put(
        "v1/services",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": kubelet.main_port}]},
        },
    )
    await own_the_service(server)


async def _real_activator_endpoints(emu: Any, admin_port: int) -> None:
    """The real activator process as the activator Service's one pod (127.0.0.1)."""
    await emu.put(
        "v1/services",
        {"metadata": {"name": ACTIVATOR.name, "namespace": ACTIVATOR_NAMESPACE}, "spec": {"selector": {"a": "b"}}},
    )
    await emu.put(
        SLICES,
        {
            "metadata": {
                "name": "activator-x1",
                "namespace": ACTIVATOR_NAMESPACE,
                "labels": {wake_endpoints.SERVICE_NAME_LABEL: ACTIVATOR.name},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
            "ports": [{"name": "admin", "port": admin_port}],
        },
    )


def _controller(admin_port: int) -> dict[str, Any]:
    first = process_.free_port()
    return {
        **FAST,
        "activator_service": ACTIVATOR,
        "activator_admin_port": admin_port,
        "activator_ports": range(first, first + 1),
    }


def _port(emu: Any) -> int:
    """Where a client of the Service lands while the activator is its endpoint: the slice's port."""
    slice_ = activator_slice(emu)
    assert slice_ is not None
    (port,) = {p["port"] for p in slice_["ports"]}
    return int(port)


async def _hold(port: int, id_: str, wait: float = 0) -> tuple[int, Any]:
    status, _, body = await _hold_answer(port, id_, wait)
    return status, body


async def _hold_answer(port: int, id_: str, wait: float = 0) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{port}/hold?id={id_}&wait={wait}",
            data=f"request {id_}",
            timeout=aiohttp.ClientTimeout(total=HOLD_LIMIT_SECS),
        ) as response:
            return response.status, dict(response.headers), await response.json(content_type=None)


async def _direct(ip: str, port: int, id_: str, wait: float = 0) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://{ip}:{port}/hold?id={id_}&wait={wait}", timeout=aiohttp.ClientTimeout(total=60)
        ) as response:
            return response.status, await response.json(content_type=None)


async def _asleep(emu: Any, kubelet: process_pods.ProcessKubelet) -> None:
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero", timeout=30)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero")
    await eventually(
        lambda: not ready_pods(emu) and all(p.exit_code is not None for p in kubelet.pods.values()),
        what="every pod's router drained and exited",
        timeout=30,
    )


@pytest.mark.timeout(HOLD_LIMIT_SECS + 60)
async def test_requests_to_a_sleeping_service_wake_it_and_are_answered_in_arrival_order(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """1. one pod serves a request, then is idle 1 s. Result: the activator becomes the Service's
    endpoint on its own port, then the Deployment goes to 0 and the pod's router drains and exits 0. 2. the pods' cold start
    held back; 100 requests sent one after another to the activator, each held before the next is
    sent. Result: one wake asked for (phase Waking), nothing reaches the model server. 3. the cold
    start ends. Result: all 100 answered 200 by the model server, each with its own body, none twice;
    the activator's slice deleted, phase Active, coldStartSeconds recorded, the activator counted one
    activation. The Service always had a ready endpoint. 4. idle again. Result: scaled to zero
    again, behind the activator on the same port."""
    emu, server = cluster
    async with stand_ins.activator(
        str(server.url).rstrip("/"),
        "--ports-configmap",
        f"{ACTIVATOR_NAMESPACE}/{ACTIVATOR.configmap}",
        "--activation-timeout-secs",
        str(HOLD_LIMIT_SECS),
        "--queue-size",
        str(HELD),
        # Its own default, not the stand-ins' 0.1 s: each poll is calls to the emulator (the port
        # map, the ModelService, the pods), and the emulator's every answer costs more with each
        # call it has recorded. At ten polls a second, holding the 100 took 70 s alone, and past the
        # activation timeout under load: the first ones held were answered 503 before the wake.
        "--poll-interval-secs",
        "1",
    ) as act:
        assert act.admin_port is not None
        await _real_activator_endpoints(emu, act.admin_port)
        await _service(cluster, kubelet)
        recorder = Recorder(emu)
        (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
        status, body = await _direct(pod["status"]["podIP"], kubelet.main_port, "warm")
        assert (status, body["id"]) == (200, "warm")  # served > 0: the idle clock may start
        op = await start_operator(**_controller(act.admin_port))
        await _asleep(emu, kubelet)
        first = kubelet.by_name(pod["metadata"]["name"])
        assert first.exit_code == 0
        port = _port(emu)
        header = f"{NAMESPACE}/llama"

        kubelet.cold_start.clear()
        sent = []
        for i in range(HELD):
            sent.append(asyncio.ensure_future(_hold(port, str(i))))
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
        await eventually(
            lambda: any(w.method == "DELETE" for w in recorder.of("endpointslices")),
            what="the activator's slice deleted",
            timeout=30,
        )
        # Active, or already asleep again (a pass whose delete got no answer puts Waking back, and the
        # next pass finds the pod ready again)
        await eventually(lambda: lifecycle(emu).get("phase") in ("Active", "ScaledToZero"), what="awake")
        record = lifecycle(emu)
        assert record["coldStartSeconds"] > 0 and record["awokenAt"] and record["wakeRequestedAt"]
        activations = await stand_ins.metric(act.admin_port, "drain_router_activations_total")
        assert sum(activations.values()) == 1
        assert await stand_ins.held(act.admin_port, header) == 0

        await _asleep(emu, kubelet)  # the next idle period: asleep again, through the activator again
        assert _port(emu) == port, "the same port: kept while the ModelService exists"
        assert [w.method for w in recorder.of("endpointslices")] == ["POST", "DELETE", "POST"]
        assert recorder.scales() == [0, 1, 0]
        recorder.check_always_an_endpoint()
        assert op.ctx is not None and not recorder.user_writes


async def test_a_request_in_flight_on_the_last_pod_finishes_whatever_the_sleep_does(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """1. one pod served a request and is idle 2. the moment the activator becomes the Service's
    endpoint (a stand-in for its pods), a 2 s request starts on the pod (a client that still had the
    pod as its endpoint). Result: it is answered 200 whole: either the sleep went on (the pod's router
    drained it and exited 0) or the busy pod cancelled it (the activator's endpoints removed once the
    router answered); the Service always had a ready endpoint."""
    emu, _ = cluster
    async with stand_in_activator(emu) as stand_in:
        await _service(cluster, kubelet)
        recorder = Recorder(emu)
        (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
        ip = pod["status"]["podIP"]
        assert (await _direct(ip, kubelet.main_port, "warm"))[0] == 200
        await start_operator(**{**_controller(stand_in.port), "activator_ports": range(20000, 21000)})
        await eventually(lambda: recorder.of("endpointslices"), what="the activator an endpoint", timeout=30)
        status, body = await _direct(ip, kubelet.main_port, "late", wait=2)
        assert (status, body["id"]) == (200, "late")
        process = kubelet.by_name(pod["metadata"]["name"])
        if process.sigterm_sent:
            await eventually(lambda: process.exit_code is not None, what="the router's exit", timeout=30)
            assert process.exit_code == 0
        recorder.check_always_an_endpoint()
        assert isinstance(stand_in, StandInActivator)


async def test_a_wake_that_never_gets_a_ready_pod_answers_503_and_leaves_the_service_asleep(
    cluster: Any, model: stand_ins.Model, kubelet: process_pods.ProcessKubelet, start_operator: Any
) -> None:
    """activationTimeout 3 s on both sides; the woken pod's cold start never ends. Result: the held
    request is answered 503 with Retry-After from the last cold start (none observed yet: the
    default) and never reaches the model server; the controller scales back to 0 with a Warning
    WakeFailed, the activator left an endpoint, phase ScaledToZero."""
    emu, server = cluster
    async with stand_ins.activator(
        str(server.url).rstrip("/"),
        "--ports-configmap",
        f"{ACTIVATOR_NAMESPACE}/{ACTIVATOR.configmap}",
        "--activation-timeout-secs",
        "3",
    ) as act:
        assert act.admin_port is not None
        await _real_activator_endpoints(emu, act.admin_port)
        await _service(cluster, kubelet, timeout=3)
        recorder = Recorder(emu)
        (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod whose router listens")
        assert (await _direct(pod["status"]["podIP"], kubelet.main_port, "warm"))[0] == 200
        await start_operator(**_controller(act.admin_port))
        await _asleep(emu, kubelet)
        kubelet.cold_start.clear()  # for good: no pod of the wake ever starts

        status, headers, body = await _hold_answer(_port(emu), "late")
        assert status == 503 and headers["Retry-After"] == str(activation.retry_after(None)), (status, headers, body)
        assert model.arrived == ["warm"]
        await eventually(lambda: ("Warning", "WakeFailed") in events(emu), what="a WakeFailed Warning", timeout=30)
        await eventually(
            lambda: lifecycle(emu).get("phase") == "ScaledToZero" and deployment(emu)["spec"]["replicas"] == 0,
            what="asleep again",
        )
        assert activator_slice(emu) is not None
        assert recorder.scales() == [0, 1, 0]
        recorder.check_always_an_endpoint()
