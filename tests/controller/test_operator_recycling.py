"""Pod recycling end to end through the real operator: emulated API server and Deployment controller,
stand-in routers answering the idle probe. Every wait is a poll with a deadline; the controller's
waits are shortened by settings, never slept through."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.decisions import durations

from . import fake_routers
from .conftest import NAMESPACE, eventually
from .rules_scenario import condition, gauge, held, held_since, make_service, patch_deployment, pods, ready_pods, status
from .scenario import event_messages, events

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.5, "max_sleep_secs": 0.5, "idle_probe_timeout_secs": 0.5}


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        yield r


def _ip(pod: dict[str, Any]) -> str:
    return str(pod["status"]["podIP"])


async def _settled(emu: Any, replicas: int) -> list[dict[str, Any]]:
    return await eventually(
        lambda: (p := ready_pods(emu)) and len(p) == replicas and len(pods(emu, alive_only=False)) == replicas and p,
        what=f"{replicas} Ready pods",
        timeout=15,
    )


async def test_one_eviction_at_a_time_oldest_deadline_first(
    cluster: Any, routers: Any, start_operator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """1. three pods start one after another (scaled up one at a time, so their deadlines differ
    and their generated names say nothing about age) 2. all expire 3. the operator evicts. Result:
    the three original pods go oldest deadline first, each eviction only once the previous
    replacement is Ready and nothing else is terminating; every eviction carries the pod's UID and
    is logged with the pod's name. Waiting for our own evictions' replacements is not reported as
    a held recycle (no PodRecycleHeld warning)."""
    emu, server = cluster
    await make_service(emu, admin_port=routers.port, replicas=1, recycling={"maxPodLifetimeSeconds": 1})
    await _settled(emu, 1)
    for replicas in (2, 3):
        await patch_deployment(server, {"spec": {"replicas": replicas}})
        await _settled(emu, replicas)
    originals = await _settled(emu, 3)
    starts = [p["status"]["startTime"] for p in originals]
    assert len(set(starts)) == 3, starts
    last = durations.parse_time(max(starts)) + 1
    await eventually(lambda: time.time() > last, what="all three expired before the operator starts")
    emu.ready_after = 1.0  # replacements stay unready for several passes: evicting then would show
    caplog.set_level(logging.INFO, logger="kopf.objects")
    await start_operator(**FAST)
    names = [p["metadata"]["name"] for p in originals]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in originals}
    await eventually(
        lambda: {e.pod for e in emu.evictions if e.code == 201} >= set(names),
        what="every original pod evicted",
        timeout=40,
    )
    done = [e for e in emu.evictions if e.code == 201]
    for e in done:
        assert e.unsettled == (), f"evicted {e.pod} while {e.unsettled} were not settled"
    assert [e.pod for e in done][:3] == names, "oldest deadline first"
    assert all(e.uid == uids[e.pod] for e in done if e.pod in uids)
    assert ("Normal", "PodRecycled") in events(emu)
    assert [m for m in event_messages(emu) if m[1] == "PodRecycleHeld"] == []

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().endswith("evicted: past its maximum lifetime")]

    # The emulator records an eviction as it answers it; the operator logs it once it has read the answer.
    await eventually(lambda: len(logged()) >= 3, what="three eviction log lines")
    assert logged()[:3] == [f"pod {name} evicted: past its maximum lifetime" for name in names]


async def test_busy_pod_is_held_visibly_then_recycled_when_idle(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. the only pod expires while its router is busy 2. many passes 3. the router goes idle.
    Result: held (status, condition naming the pod, gauge 1, exactly one PodRecycleHeld), then
    evicted; held cleared, condition False, gauge 0."""
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    (pod,) = await _settled(emu, 1)
    routers.busy(_ip(pod))
    op = await start_operator(**FAST)
    name = pod["metadata"]["name"]
    await eventually(lambda: (held(emu) or {}).get("reason") == "Busy", what="held Busy", timeout=15)
    assert held(emu)["pod"] == name and held(emu)["uid"] == pod["metadata"]["uid"]  # type: ignore[index]
    cond = condition(emu, "RecycleHeld")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "Busy" and name in cond["message"]
    await eventually(lambda: gauge(op) == 1, what="the held gauge at 1 (set just after the status write)")
    since = durations.parse_time(held(emu)["since"])  # type: ignore[index]
    assert held_since(op) == since, "the held-since gauge is the hold's since (the pod's deadline)"
    asked = len(routers.asked)
    await eventually(lambda: len(routers.asked) >= asked + 3, what="three more probes", timeout=10)
    assert not emu.evictions
    assert [m for m in event_messages(emu) if m[1] == "PodRecycleHeld"] == [
        ("Warning", "PodRecycleHeld", f"pod {name} is past its maximum lifetime and not recycled: Busy")
    ]
    routers.idle(_ip(pod))
    await eventually(lambda: [e.pod for e in emu.evictions] == [name], what="the eviction", timeout=10)
    await eventually(
        lambda: held(emu) is None and (condition(emu, "RecycleHeld") or {}).get("status") == "False",
        what="held cleared",
        timeout=10,
    )
    await eventually(lambda: gauge(op) == 0, what="the held gauge back at 0")
    assert held_since(op) is None, "no held-since series once nothing is held"


async def test_probe_failure_holds_and_never_evicts(cluster: Any, routers: Any, start_operator: Any) -> None:
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    (pod,) = await _settled(emu, 1)
    routers.answer(_ip(pod), 500, {"oops": True})
    await start_operator(**FAST)
    await eventually(lambda: (held(emu) or {}).get("reason") == "IdleProbeFailed", what="IdleProbeFailed", timeout=15)
    asked = len(routers.asked)
    await eventually(lambda: len(routers.asked) >= asked + 3, what="three more probes", timeout=10)
    assert not emu.evictions


async def test_pdb_refusal_is_retried_no_sooner_than_the_retry_wait(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. a PDB allows no disruption 2. the pod expires, idle. Result: 429, held DisruptionBudget,
    the next attempt no sooner than ``recycle_retry_secs``; once the budget allows, evicted."""
    emu, server = cluster
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    await emu.put(
        "policy/v1/poddisruptionbudgets",
        {"metadata": {"name": "llama", "namespace": NAMESPACE}, "spec": {"selector": {}, "maxUnavailable": 0}},
    )
    await _settled(emu, 1)
    op = await start_operator(**FAST)
    await eventually(lambda: len(emu.evictions) >= 3, what="three refused evictions", timeout=20)
    refused = emu.evictions[:3]
    assert [e.code for e in refused] == [429, 429, 429]
    gaps = [b.at - a.at for a, b in itertools.pairwise(refused)]
    assert all(gap >= FAST["recycle_retry_secs"] - 0.05 for gap in gaps), gaps
    # The emulator records a refusal as it answers it; the operator counts it once it has read the answer.
    await eventually(lambda: (held(emu) or {}).get("reason") == "DisruptionBudget", what="held DisruptionBudget")
    await eventually(
        lambda: (
            (
                op.ctx.metrics.registry.get_sample_value(
                    "drain_router_controller_eviction_rejections_total", {"reason": "DisruptionBudget"}
                )
                or 0
            )
            >= 3
        ),
        what="three refusals counted",
    )
    response = await server.client.patch(
        f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/llama",
        json={"spec": {"maxUnavailable": 1}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="the eviction", timeout=10)


async def test_forbidden_eviction_degrades_and_the_lifecycle_pass_still_runs(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """The image is newer than the chart: create pods/eviction is not granted. Result: a
    PodRecycleForbidden Warning naming the permission, held Forbidden, and the lifecycle rule
    (ScaleToZero after 3 s idle, counted from now) still scales the Deployment to zero."""
    emu, _ = cluster
    emu.forbid("create", "pods/eviction")
    routers.idle_since = time.time()
    await make_service(
        emu,
        admin_port=routers.port,
        recycling={"maxPodLifetimeSeconds": 1},
        lifecycle={"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 3}}]},
    )
    await _settled(emu, 1)
    await start_operator(**FAST)
    await eventually(
        lambda: any(r == "PodRecycleForbidden" and "create pods/eviction" in m for _, r, m in event_messages(emu)),
        what="PodRecycleForbidden",
        timeout=15,
    )
    assert (held(emu) or {}).get("reason") == "Forbidden"
    await eventually(
        lambda: emu.get("apps/v1/deployments", NAMESPACE, "llama")["spec"]["replicas"] == 0,
        what="scaled to zero by the lifecycle pass",
        timeout=15,
    )
    assert (status(emu).get("lifecycle") or {}).get("scaledToZeroAt")


async def test_a_replacement_stuck_past_the_settle_bound_is_reported(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. two expired pods 2. the first is evicted and its replacement never turns Ready. Result: the
    second waits unreported (RecycleHeld False, reason Recycling) for the settle bound, then is held
    WorkloadUnstable with one PodRecycleHeld warning: a stuck replacement is news."""
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, replicas=2, recycling={"maxPodLifetimeSeconds": 1})
    originals = await _settled(emu, 2)
    last = max(durations.parse_time(p["status"]["startTime"]) for p in originals) + 1
    await eventually(lambda: time.time() > last, what="both expired before the operator starts")
    emu.ready_after = 3600.0
    await start_operator(**{**FAST, "recycle_settle_secs": 1.5})
    (first,) = await eventually(
        lambda: [e for e in emu.evictions if e.code == 201], what="the first eviction", timeout=15
    )
    await eventually(
        lambda: (condition(emu, "RecycleHeld") or {}).get("reason") == "Recycling", what="Recycling", timeout=10
    )
    await eventually(lambda: (held(emu) or {}).get("reason") == "WorkloadUnstable", what="held", timeout=15)
    assert time.time() >= first.at + 1.5, "reported before the settle bound"
    await eventually(
        lambda: [m for m in event_messages(emu) if m[1] == "PodRecycleHeld"], what="the warning", timeout=10
    )
    warnings = [m for m in event_messages(emu) if m[1] == "PodRecycleHeld"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning" and "WorkloadUnstable" in warnings[0][2]
    assert len([e for e in emu.evictions if e.code == 201]) == 1
