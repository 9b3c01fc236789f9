"""Pod recycling on the real control plane: the controller evicts pods past their maximum lifetime
through the real Eviction API, one at a time, only when the pod's real router says it is idle, and
the real PodDisruptionBudget holds it while another pod under the budget is unavailable.

A model release with a ModelService (``spec.recycling.maxPodLifetimeSeconds`` of a few seconds) runs
behind the gateway; the routers log every request (``router.accessLog``), and the API server's
audit log records every eviction the controller asks for, and its answer. Four things are proven:

- **Held while busy.** Long streams pin both pods past their lifetime: the controller holds them
  (``status.recycling.held.reason: Busy``) and evicts them once their streams are done.
- **Evicted only idle, under load.** OpenAI SDK clients stream through the gateway with pauses (so
  routers are idle now and then) while pods keep expiring: evictions happen, and each one came after
  an idle answer. Every stream its router had in flight when the eviction arrived began after the
  controller's last read before it, so after the probe that found the router idle (the audit log
  says when the read ended, the router's access log when each stream began: one clock). Not a
  stream is lost: those that reached a pod in that moment are drained.
- **One at a time, the Deployment replaces each.** At every eviction, replayed from the pods' watch
  in the API server's order, every other pod of the Deployment was Ready and none was terminating
  (the last evicted pod had drained and gone); each evicted pod is gone and replaced by a new one.
- **The PodDisruptionBudget holds.** A canary Deployment written by hand with the release's labels
  (the chart's PDB and Service select it; the ModelService does not own it, so the controller's own
  gate does not wait for it) is made unavailable by hanging its model server (SIGSTOP: the router's
  ``/readyz`` follows the model server's ``/health``). The budget then allows no disruption: the
  controller's eviction is answered 429 (audit log), the hold is ``DisruptionBudget``, no pod is
  evicted until the canary is Ready again (SIGCONT), and then recycling goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

# Imported here, not in the scenario: a first import takes seconds, and would stall the event loop
# (the gateway's updates with it) in the middle of the scenario.
import openai
import pytest

from drain_router.decisions import durations
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog, Call, ok
from e2e.kubernetes.conftest import CONTROLLER_USER
from e2e.kubernetes.containers import container_pid
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.kube import MODEL_CHART, Helm, Json, Kube, is_ready, path
from e2e.kubernetes.timeline import History
from e2e.real_engine import Outcome, Record, sdk_stream

NAMESPACE = "team-a"
RELEASE = "kcrec"
FULLNAME = f"{RELEASE}-drain-router"
"""The Deployment, the ModelService, the PDB and the Service: the chart's full name."""
CANARY = f"{RELEASE}-canary"
REPLICAS = 2
LIFETIME_SECS = 10
SELECTOR = {
    "app.kubernetes.io/name": "drain-router",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "model-server",
}
LONG_CHUNKS = 400
"""A stream of 20 s: longer than a pod's lifetime, so a pod carrying one expires busy."""
EVICTIONS_UNDER_LOAD = 3
#: The scenario's own time; the session's setup (the machine's lock, the cluster) is not counted.
pytestmark = pytest.mark.timeout(600, func_only=True)


def values() -> dict[str, Any]:
    """The fake model behind the router, its ModelService recycling pods after LIFETIME_SECS; the
    router's readiness follows the model server's /health within about 2 s; a short route settle
    keeps the teardown at the end short."""
    return models.fake_model_values(
        NAMESPACE,
        RELEASE,
        replicas=REPLICAS,
        model_service=True,
        extra={
            "router": {
                "accessLog": True,
                "upstreamHealthPath": "/health",
                "upstreamHealthIntervalSecs": 1,
                "upstreamHealthTimeoutSecs": 1,
                "upstreamHealthFailureThreshold": 1,
            },
            "modelService": {
                "enabled": True,
                "recycling": {"enabled": True, "maxPodLifetimeSeconds": LIFETIME_SECS},
                "deletion": {"routeSettle": "2s"},
            },
        },
    )


@dataclasses.dataclass
class PacedLoad:
    """``clients`` OpenAI SDK clients through the gateway, each streaming a completion and then
    pausing ``pause_secs`` before the next, until :meth:`stop`. The pause is load shaping, not
    synchronisation: routers are idle now and then, so expired pods can be recycled under load."""

    base_url: str
    clients: int
    max_tokens: int
    pause_secs: float
    headers: dict[str, str]
    records: list[Record] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    async def start(self) -> None:
        for _ in range(self.clients):
            client = openai.AsyncOpenAI(
                base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=60.0,
                default_headers=self.headers,
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(self._run(client)))

    async def _run(self, client: Any) -> None:
        async with client:
            while not self._stopping:
                self.records.append(await sdk_stream(client, self.max_tokens))
                await asyncio.sleep(self.pause_secs)

    async def stop(self, timeout: float = 90.0) -> None:
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), timeout)


async def one_stream(base_url: str, headers: dict[str, str], chunks: int) -> Record:
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=60.0, default_headers=headers
    ) as client:
        return await sdk_stream(client, chunks)


def lost(records: list[Record]) -> list[Record]:
    return [r for r in records if r.outcome is not Outcome.COMPLETED]


def selected(pod: Json) -> bool:
    labels = pod["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in SELECTOR.items())


def owned(pod: Json) -> bool:
    """A pod of the release's Deployment (its ReplicaSets are named after it), not the canary's."""
    refs = pod["metadata"].get("ownerReferences", [])
    return selected(pod) and any(r["kind"] == "ReplicaSet" and r["name"].startswith(f"{FULLNAME}-") for r in refs)


def terminating(pod: Json) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def streams(cluster_root: Path, pod: Json) -> list[tuple[float, float]]:
    """(start, end) in Unix seconds of every request the pod's router logged (``router.accessLog``)."""
    meta = pod["metadata"]
    log = cluster_root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}" / "router.log"
    found: list[tuple[float, float]] = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == "request" and entry.get("path", "").startswith("/v1/"):
                end = durations.parse_time(entry["timestamp"])
                found.append((end - float(entry["duration_s"]), end))
    return found


async def modelservice_status(kube: Kube) -> Json:
    found = await kube.get("ModelService", NAMESPACE, FULLNAME)
    assert found is not None, "the ModelService is gone"
    return dict(found.get("status") or {})


async def held_for(kube: Kube, reason: str) -> Json | None:
    held = (await modelservice_status(kube)).get("recycling", {}).get("held") or {}
    return held if held.get("reason") == reason else None


def evictions_done(audit: AuditLog, since: float = 0.0) -> list[Call]:
    """The controller's evictions the API server admitted (2xx), asked for from ``since`` on."""
    return [c for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if ok(c.code) and c.received >= since]


async def pods_of(kube: Kube, deployment_owned: bool) -> list[Json]:
    return [p for p in await kube.list("Pod", NAMESPACE) if selected(p) and owned(p) == deployment_owned]


async def deployment_settled(kube: Kube) -> bool:
    """REPLICAS Ready pods of the Deployment and nothing terminating: a recycle fully done."""
    found = await pods_of(kube, True)
    return len(found) == REPLICAS and all(is_ready(p) for p in found)


async def test_recycling_evicts_idle_pods_one_at_a_time_within_the_budget(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    started = time.monotonic()
    audit = AuditLog(kube.cluster.audit_log, whole=True)
    history = History(kube.api, path("Pod", NAMESPACE))
    await history.start()
    helm.install(RELEASE, MODEL_CHART, NAMESPACE, values())
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=1.0)
    await gateway.start()
    host = models.hostname(NAMESPACE, RELEASE)
    headers = {"Host": host}
    stopped: list[int] = []
    try:
        await kube.wait("the gateway serving both pods", lambda: _now(len(gateway.servers(host)) == REPLICAS))

        # Held while busy: streams longer than a pod's lifetime, on both pods.
        pinned = [asyncio.create_task(one_stream(gateway.url, headers, LONG_CHUNKS)) for _ in range(4)]

        async def held_busy() -> Json | None:
            failed = [t.result() for t in pinned if t.done() and t.result().outcome is not Outcome.COMPLETED]
            assert not failed, f"a long stream failed before any pod was held busy: {failed}"
            return await held_for(kube, "Busy")

        busy = await kube.wait("a pod past its lifetime held busy", held_busy, timeout=60)
        long_streams = await asyncio.wait_for(asyncio.gather(*pinned), 60)
        assert not lost(long_streams), long_streams

        # Evicted only idle, under load.
        load = PacedLoad(gateway.url, 3, models.CHUNKS, 1.0, headers)
        load_started = time.time()
        await load.start()
        await kube.wait(
            f"{EVICTIONS_UNDER_LOAD} evictions under load",
            lambda: _now(len(evictions_done(audit, since=load_started)) >= EVICTIONS_UNDER_LOAD),
            timeout=180,
        )
        await load.stop()
        under_load = len([c for c in evictions_done(audit, since=load_started) if c.received <= time.time()])
        assert len(load.records) >= 3 * EVICTIONS_UNDER_LOAD
        assert not lost(load.records), lost(load.records)[:5]
        await kube.wait("the Deployment settled after the load", lambda: deployment_settled(kube), timeout=60)

        # The PodDisruptionBudget holds while the canary is unavailable.
        raced_429, held_pdb, canary_figures = await budget_holds(kube, audit, stopped)

        await stop_recycling(kube, audit, history)
        await history.stop()
        evictions = evictions_done(audit)
        assert busy["pod"] in {c.name for c in evictions}, f"the pod held busy, {busy['pod']}, was never recycled"
        raced = check_idle_at_eviction(kube, audit, history, evictions)
        replay = check_one_at_a_time(history, evictions)
        report.append(
            f"{len(evictions)} evictions ({under_load} under load, {len(load.records) + len(long_streams)} streams, "
            f"0 lost, {raced} streams reached a pod between its idle probe and its eviction); "
            f"held Busy: {busy['pod']}; PDB: {raced_429} evictions answered 429 while the canary was unavailable "
            f"({canary_figures}), held {held_pdb['reason']}; replayed {replay} pod changes; "
            f"{time.monotonic() - started:.0f} s"
        )
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
        await gateway.stop()
        await kube.delete("Deployment", NAMESPACE, CANARY)
        helm.uninstall(RELEASE, NAMESPACE)
        await history.stop()


async def _now(value: object) -> object:
    return value


async def stop_recycling(kube: Kube, audit: AuditLog, history: History) -> None:
    """A lifetime of a day, so the evictions end and the history can be read whole: a pass of the
    controller read the new spec (after it, no eviction is due), and the pods' watch shows the
    Deployment settled (every event of the last recycle is in the history, which is in order)."""
    await kube.patch("ModelService", NAMESPACE, FULLNAME, {"spec": {"recycling": {"maxPodLifetimeSeconds": 86400}}})
    patched = time.time()

    def read_since() -> bool:
        return any(
            c.resource == "modelservices" and c.verb == "get" and c.name == FULLNAME and c.received > patched
            for c in audit.by(CONTROLLER_USER, NAMESPACE)
        )

    await kube.wait("a pass of the controller reading the new lifetime", lambda: _now(read_since()), timeout=60)

    async def settled() -> bool:
        active = [p for p in history.current().values() if owned(p)]
        return len(active) == REPLICAS and all(is_ready(p) for p in active)

    await kube.wait("the watch showing the Deployment settled", settled, timeout=90)


def check_idle_at_eviction(kube: Kube, audit: AuditLog, history: History, evictions: list[Call]) -> int:
    """Every stream a pod's router had in flight when its eviction arrived began after the end of the
    controller's last read of the service before that eviction (the pass that probed the router:
    observe, probe, evict). Returns how many such streams raced the eviction (drained, not lost)."""
    reads = [
        c
        for c in audit.by(CONTROLLER_USER, NAMESPACE)
        if c.verb in ("get", "list") and c.resource in ("modelservices", "pods", "deployments", "replicasets")
    ]
    pods = {change.name: change.obj for change in history.changes}
    raced = 0
    for eviction in evictions:
        observed = max((c.answered for c in reads if c.received < eviction.received), default=None)
        assert observed is not None, f"no read before {eviction}"
        in_flight = [(s, e) for s, e in streams(kube.cluster.root, pods[eviction.name]) if s < eviction.received < e]
        early = [(s, e) for s, e in in_flight if s <= observed]
        assert not early, (
            f"{eviction}: its router had {len(early)} stream(s) in flight that began before the "
            f"controller's last read at {observed:.6f}: {early}"
        )
        raced += len(in_flight)
    return raced


def check_one_at_a_time(history: History, evictions: list[Call]) -> int:
    """Replayed from the pods' watch: each eviction (the pod's deletionTimestamp appearing) found every
    other pod of the Deployment Ready and none terminating (the last evicted one gone); nothing but the controller's evictions
    marked a pod of the Deployment for deletion; each evicted pod is gone, and the Deployment made a
    new pod for each. Returns the number of changes replayed."""
    assert not history.resyncs, "the pods' watch broke: the order across a resync is not the server's"
    evicted = {c.name for c in evictions}
    marked: list[str] = []
    count = 0
    for change, state in history.replay():
        count += 1
        pod = change.obj
        if change.type == "DELETED" or not owned(pod) or not terminating(pod):
            continue
        if change.name in marked:
            continue
        before = state.get(change.name)
        if before is not None and terminating(before):
            continue
        marked.append(change.name)
        assert change.name in evicted, f"pod {change.name} marked for deletion by something else than an eviction"
        # A pod still draining from the last eviction holds the next one, as one not yet Ready does.
        others = [p for name, p in state.items() if owned(p) and name != change.name]
        unready = [p["metadata"]["name"] for p in others if terminating(p) or not is_ready(p)]
        assert not unready, f"pod {change.name} evicted while {unready} was not Ready or still terminating"
        assert len(others) == REPLICAS - 1, (
            f"pod {change.name} evicted beside {[p['metadata']['name'] for p in others]}"
        )
    assert sorted(marked) == sorted(evicted), (marked, evicted)
    gone = {c.name for c in history.changes if c.type == "DELETED"}
    assert evicted <= gone, f"evicted but never deleted: {evicted - gone}"
    created = {c.name for c in history.changes if owned(c.obj)}
    assert len(created) == REPLICAS + len(evicted), f"{len(created)} pods for {len(evicted)} evictions"
    return count


async def budget_holds(kube: Kube, audit: AuditLog, stopped: list[int]) -> tuple[int, Json, str]:
    """The canary made unavailable: the controller's evictions are refused 429 and none succeeds until
    it is Ready again; then one does. Returns (429s seen while it was down, the hold, figures)."""
    model = await kube.get("Deployment", NAMESPACE, FULLNAME)
    assert model is not None
    template = copy.deepcopy(model["spec"]["template"])
    template["metadata"]["labels"]["track"] = "canary"
    await kube.apply({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": CANARY, "namespace": NAMESPACE, "labels": {"track": "canary"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {**SELECTOR, "track": "canary"}}, "template": template},
    })  # fmt: skip

    async def canary(ready: bool) -> Json | None:
        found = await pods_of(kube, False)
        return found[0] if len(found) == 1 and is_ready(found[0]) == ready else None

    pod = await kube.wait("the canary Ready", lambda: canary(True), timeout=60)
    pid = container_pid(pod, "model-server")
    os.killpg(pid, signal.SIGSTOP)
    stopped.append(pid)
    await kube.wait("the canary not Ready", lambda: canary(False), timeout=30)

    async def no_disruption() -> bool:
        pdb = await kube.get("PodDisruptionBudget", NAMESPACE, FULLNAME)
        status = (pdb or {}).get("status", {})
        return bool(status.get("expectedPods") == REPLICAS + 1 and status.get("disruptionsAllowed") == 0)

    await kube.wait("the budget allowing no disruption", no_disruption, timeout=30)
    down = time.time()

    def refused() -> list[Call]:
        return [c for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if c.code == 429 and c.received > down]

    await kube.wait("an eviction refused by the budget", lambda: _now(refused()), timeout=90)
    assert all(c.cause == "DisruptionBudget" for c in refused()), [str(c) for c in refused()]
    held = await kube.wait("the hold DisruptionBudget", lambda: held_for(kube, "DisruptionBudget"), timeout=30)
    up = time.time()
    os.killpg(pid, signal.SIGCONT)
    stopped.remove(pid)
    await kube.wait("the canary Ready again", lambda: canary(True), timeout=30)
    resumed = await kube.wait(
        "an eviction after the canary recovered", lambda: _now(evictions_done(audit, since=up)), timeout=90
    )
    # Every eviction asked for while the canary was down was refused: the budget held, not the gate.
    admitted = [c for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if ok(c.code) and down <= c.received <= up]
    assert not admitted, f"evicted while the canary was unavailable: {[str(c) for c in admitted]}"
    count = len([c for c in refused() if c.received <= up])
    await kube.delete("Deployment", NAMESPACE, CANARY)
    await kube.wait("the canary gone", lambda: _now_gone(kube), timeout=60)
    figures = f"down {up - down:.0f} s, next eviction {resumed[0].received - up:.0f} s after it recovered"
    return count, held, figures


async def _now_gone(kube: Kube) -> bool:
    return not await pods_of(kube, False)
