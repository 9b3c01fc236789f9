"""The controller and real routers cooperating: process-backed pods
(:mod:`process_pods`), each a real ``drain-router serve`` on its own loopback podIP in front of a
shared ``drain-router-dev fake-model``; the real operator against the emulator. The idle probe asks
those routers, and an eviction's SIGTERM starts their drain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drain_router.controller import probe
from drain_router.decisions import durations
from drain_router_dev import process as process_
from drain_router_dev import streams

from . import process_pods
from .conftest import MSVC, NAMESPACE, eventually
from .rules_scenario import LABELS, condition, deployment, gauge, held, make_service, patch_deployment, ready_pods
from .rules_scenario import status as status_of
from .scenario import delete_msvc, delete_order, event_messages, events, exists

pytestmark = pytest.mark.slow

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.0, "max_sleep_secs": 0.5, "idle_probe_timeout_secs": 1.0}
CHUNK_MS = 100


@pytest.fixture
async def model() -> AsyncIterator[str]:
    async with process_pods.fake_model("--interval-ms", str(CHUNK_MS)) as url:
        yield url


@pytest.fixture
async def kubelet(cluster: Any, model: str) -> AsyncIterator[process_pods.ProcessKubelet]:
    emu, _ = cluster
    emu.ready_after = 0.0
    kubelet = process_pods.ProcessKubelet(
        emu,
        upstream=model,
        admin_port=process_.free_port(),
        main_port=process_.free_port(),
        router_args=("--shutdown-drain-secs", "0", "--termination-grace-secs", "30"),
    )
    try:
        yield kubelet
    finally:
        await kubelet.close()


async def _stream(ip: str, port: int, chunks: int) -> tuple[int, list[str]]:
    """One streamed completion through a pod's router; (status, the ``data`` payloads)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://{ip}:{port}/v1/completions",
            json={"stream": True, "chunks": chunks, "prompt": "x"},
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response:
            body = await response.read()
    return response.status, streams.events_of(body)


async def _one_ready_pod(
    emu: Any, kubelet: process_pods.ProcessKubelet
) -> tuple[dict[str, Any], process_pods.PodProcess]:
    (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod with its router listening", timeout=30)
    return pod, kubelet.by_name(pod["metadata"]["name"])


async def test_a_busy_pod_is_held_until_its_stream_ends_then_evicted_once(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """(a) 1. a slow stream through pod A 2. A expires. Result: no eviction; one PodRecycleHeld,
    RecycleHeld True naming A, gauge 1. 3. the stream ends. Result: exactly one eviction with A's UID,
    A's router drains and exits 0, the stream completed, gauge 0."""
    emu, _ = cluster
    await make_service(emu, exits_after=None, admin_port=kubelet.admin_port, recycling={"maxPodLifetimeSeconds": 2})
    _pod, a = await _one_ready_pod(emu, kubelet)
    stream = asyncio.ensure_future(_stream(a.ip, kubelet.main_port, chunks=60))  # ~6 s
    op = await start_operator(**FAST)
    await eventually(lambda: (held(emu) or {}).get("reason") == "Busy", what="A held Busy", timeout=15)
    assert not stream.done(), "the stream must still run while A is held"
    assert not emu.evictions
    cond = condition(emu, "RecycleHeld")
    assert cond is not None and cond["status"] == "True" and a.name in cond["message"]
    await eventually(lambda: gauge(op) == 1, what="gauge 1")
    status, lines = await asyncio.wait_for(stream, 30)
    assert status == 200 and lines[-1] == streams.DONE and len(lines) == 61, lines[-3:]
    await eventually(lambda: a.exit_code is not None, what="A's router drained and exited", timeout=20)
    assert a.exit_code == 0
    assert [e.uid for e in emu.evictions if e.uid == a.uid] == [a.uid]
    assert [e.code for e in emu.evictions if e.uid == a.uid] == [201]
    assert [m for m in event_messages(emu) if m[1] == "PodRecycleHeld" and a.name in m[2]] == [
        ("Warning", "PodRecycleHeld", f"pod {a.name} is past its maximum lifetime and not recycled: Busy")
    ]
    assert "drain.start" in a.router.names() or "drain.closing" in a.router.names()
    await eventually(lambda: gauge(op) == 0 and (held(emu) or {}).get("uid") != a.uid, what="gauge 0")


async def test_idle_timeout_evicts_a_busy_pod_and_its_stream_still_completes(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """(b) maxPodLifetimeIdleTimeoutSeconds 2: A is evicted while a stream runs through it; the
    router drains and the stream still completes; the router exits 0."""
    emu, _ = cluster
    await make_service(
        emu,
        exits_after=None,
        admin_port=kubelet.admin_port,
        recycling={"maxPodLifetimeSeconds": 1, "maxPodLifetimeIdleTimeoutSeconds": 2},
    )
    _, a = await _one_ready_pod(emu, kubelet)
    stream = asyncio.ensure_future(_stream(a.ip, kubelet.main_port, chunks=80))  # ~8 s
    await start_operator(**FAST)
    await eventually(
        lambda: any(e.uid == a.uid and e.code == 201 for e in emu.evictions), what="A evicted while busy", timeout=20
    )
    assert not stream.done(), "evicted while its stream runs"
    status, lines = await asyncio.wait_for(stream, 30)
    assert status == 200 and lines[-1] == streams.DONE and len(lines) == 81
    await eventually(lambda: a.exit_code is not None, what="A's router exited", timeout=20)
    assert a.exit_code == 0


async def test_nothing_listening_on_the_admin_port_is_held_and_never_evicted(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """(c) the ModelService names an admin port nothing listens on at the podIP: held
    IdleProbeFailed, never evicted."""
    emu, _ = cluster
    await make_service(emu, exits_after=None, admin_port=process_.free_port(), recycling={"maxPodLifetimeSeconds": 1})
    _, a = await _one_ready_pod(emu, kubelet)
    await start_operator(**FAST)
    await eventually(lambda: (held(emu) or {}).get("reason") == "IdleProbeFailed", what="IdleProbeFailed", timeout=15)
    requests = len(emu._requests)
    await eventually(lambda: len(emu._requests) > requests + 20, what="more passes", timeout=15)
    assert not emu.evictions and a.exit_code is None


async def test_pdb_refusal_waits_for_the_retry_then_evicts(cluster: Any, kubelet: Any, start_operator: Any) -> None:
    """(d) a PDB with maxUnavailable 0: 429 and no new attempt before recycle_retry_secs; once the
    budget allows, A is evicted and its router exits 0."""
    emu, server = cluster
    await emu.put(
        "policy/v1/poddisruptionbudgets",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": LABELS}, "maxUnavailable": 0},
        },
    )
    await make_service(emu, exits_after=None, admin_port=kubelet.admin_port, recycling={"maxPodLifetimeSeconds": 1})
    _, a = await _one_ready_pod(emu, kubelet)
    await start_operator(**FAST)
    await eventually(lambda: len(emu.evictions) >= 2, what="two refused evictions", timeout=20)
    first, second = emu.evictions[:2]
    assert (first.code, second.code) == (429, 429)
    assert second.at - first.at >= FAST["recycle_retry_secs"] - 0.05
    assert (held(emu) or {}).get("reason") == "DisruptionBudget" and a.exit_code is None
    response = await server.client.patch(
        f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/llama",
        json={"spec": {"maxUnavailable": 1}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
    await eventually(lambda: a.exit_code is not None, what="A evicted and drained", timeout=20)
    assert a.exit_code == 0 and [e.code for e in emu.evictions if e.uid == a.uid][-1] == 201


async def test_forbidden_eviction_lifecycle_and_deletion_still_progress(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """(e) create pods/eviction not granted: PodRecycleForbidden, A never evicted; the lifecycle rule
    still scales to zero (A's router gets SIGTERM from the scale-down and exits 0), and deleting the
    ModelService still runs the staged teardown to the end."""
    emu, server = cluster
    emu.forbid("create", "pods/eviction")
    await make_service(
        emu,
        exits_after=None,
        admin_port=kubelet.admin_port,
        recycling={"maxPodLifetimeSeconds": 1},
        lifecycle={"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 3}}]},
    )
    _, a = await _one_ready_pod(emu, kubelet)
    await start_operator(**FAST)
    await eventually(
        lambda: any(r == "PodRecycleForbidden" and "create pods/eviction" in m for _, r, m in event_messages(emu)),
        what="PodRecycleForbidden",
        timeout=15,
    )
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    await eventually(lambda: a.exit_code is not None, what="A's router stopped by the scale-down", timeout=20)
    assert a.exit_code == 0 and not emu.evictions
    await delete_msvc(emu, server)
    await eventually(lambda: not exists(emu, MSVC), what="the staged teardown released", timeout=20)
    order = delete_order(emu)
    assert order.index("httproutes/llama") < order.index("deployments/llama"), order


async def test_three_expired_idle_pods_one_eviction_at_a_time(cluster: Any, kubelet: Any, start_operator: Any) -> None:
    """(f) three expired idle pods: each eviction only once the previous replacement's router is
    up and Ready; the three routers exit 0."""
    emu, server = cluster
    await make_service(emu, exits_after=None, admin_port=kubelet.admin_port, recycling={"maxPodLifetimeSeconds": 2})
    for replicas in (1, 2, 3):
        if replicas > 1:
            await patch_deployment(server, {"spec": {"replicas": replicas}})
        await eventually(lambda n=replicas: len(ready_pods(emu)) == n, what=f"{replicas} Ready pods", timeout=30)
    originals = [kubelet.by_name(p["metadata"]["name"]) for p in ready_pods(emu)]
    await start_operator(**FAST)
    await eventually(lambda: all(p.exit_code is not None for p in originals), what="the three recycled", timeout=60)
    done = [e for e in emu.evictions if e.code == 201]
    assert [e.uid for e in done][:3] == [p.uid for p in originals]
    for e in done:
        assert e.unsettled == (), f"evicted {e.pod} while {e.unsettled} were not settled"
    assert [p.exit_code for p in originals] == [0, 0, 0]


async def test_scale_to_zero_keeps_the_route_and_after_downtime_only_delete_self_runs(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """(g) 1. one served request, then idle 2. ScaleToZero after 2 s: replicas 0, route kept
    3. the operator is stopped past every threshold 4. restarted. Result: only DeleteSelf runs (no
    DeleteWorkload first), and the staged teardown deletes the route before the workload."""
    emu, _ = cluster
    await make_service(
        emu,
        exits_after=None,
        admin_port=kubelet.admin_port,
        lifecycle={
            "rules": [
                {"policy": "ScaleToZero", "condition": {"idleSeconds": 2}},
                {"policy": "DeleteWorkload", "condition": {"idleSeconds": 4}},
                {"policy": "DeleteSelf", "condition": {"idleSeconds": 5}},
            ]
        },
    )
    _, a = await _one_ready_pod(emu, kubelet)
    status, lines = await _stream(a.ip, kubelet.main_port, chunks=2)
    assert status == 200 and lines[-1] == streams.DONE
    op = await start_operator(**FAST)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    assert exists(emu, "gateway.networking.k8s.io/v1/httproutes"), "ScaleToZero keeps the route"
    await op.stop()
    idle_since = durations.parse_time(status_of(emu)["lifecycle"]["idleSince"])
    await eventually(lambda: time.time() > idle_since + 5.5, what="past every threshold, operator down")
    await start_operator(**FAST)
    await eventually(lambda: not exists(emu, MSVC), what="deleted by DeleteSelf and released", timeout=20)
    reasons = [r for _, r in events(emu)]
    assert "LifecycleDeleteSelf" in reasons and "LifecycleDeleteWorkload" not in reasons
    order = delete_order(emu)
    assert order.index("httproutes/llama") < order.index("deployments/llama"), order


async def test_the_kubelet_sigkills_a_router_still_running_at_the_end_of_grace(cluster: Any, kubelet: Any) -> None:
    """Emulator: a pod deleted with a 1 s grace whose router still has a stream in flight (the
    router waits for in-flight work well past 1 s) is removed at the end of its grace, and its router
    process is SIGKILLed then: the stream is cut."""
    emu, server = cluster
    await make_service(emu, exits_after=None, admin_port=kubelet.admin_port, grace=1)
    _, a = await _one_ready_pod(emu, kubelet)
    stream = asyncio.ensure_future(_stream(a.ip, kubelet.main_port, chunks=100))  # ~10 s
    async with aiohttp.ClientSession() as session:

        async def busy() -> bool:
            return (await probe.probe(session, a.ip, kubelet.admin_port)).inflight == 1

        await process_.wait_until(busy, 10, "the stream to reach the router")
    response = await server.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{a.name}", json={})
    assert response.status == 200
    await eventually(lambda: a.exit_code is not None, what="the router killed at the end of grace", timeout=10)
    assert a.exit_code == -9, a.exit_code
    assert emu.get("v1/pods", NAMESPACE, a.name) is None
    try:
        _, lines = await asyncio.wait_for(stream, 10)
    except aiohttp.ClientError:
        lines = []
    assert lines[-1:] != [streams.DONE], "the stream was cut by the SIGKILL"
