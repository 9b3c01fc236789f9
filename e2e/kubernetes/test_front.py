"""A rollout restart under the front (``drain-router front``) on the real control plane: the streams
that the routers' deadline cuts on the old pods are continued on other pods by the front, in the same
responses, and the front calls the API server for nothing but what its Role is for.

**Real**: helm installs the model chart with ``front.enabled`` and its ModelService: the front's
Deployment, Service, ServiceAccount, Role and RoleBinding, the HTTPRoute sent to the front's Service.
The API server authenticates the front's bound service-account token and authorizes each of its calls
by that Role, and records them in its audit log; ``kubectl rollout restart``'s annotation starts the
rollout, which the Deployment and ReplicaSet controllers roll one pod at a time; the EndpointSlice
controller writes the slices the front lists (``--service``: the ModelService's Services, every
poll); the front and the routers are the release's own code (``drain-router front``,
``drain-router serve``); the clients are the OpenAI SDK's (streamed completions, no retries).

**Stand-ins**: the node agent runs each pod's containers as processes (the front, the routers, the
fake model servers), ends a deleted pod as the kubelet does (preStop, SIGTERM, the grace) and runs the
readiness probes the EndpointSlices follow; the gateway is HAProxy following the HTTPRoute to the
front's Service's EndpointSlices (:mod:`e2e.kubernetes.gateway`); the model server is the fake one,
whose answer is the sequence `` t0 t1 ...`` that it resumes after any text ending in ``t<k>`` (so a
continued answer can be checked against the uninterrupted one), numbering each leg's chunks from 0
(``seq``: a client sees where a continuation joined).

The model pods' grace (:data:`GRACE_SECS`) is shorter than a stream (:data:`TOKENS` tokens at the fake
model's pace): at each old pod's deletion its router drains (``/readyz`` 503, ``Connection: close``:
the front sends it nothing new), and at its deadline (grace - 2 s after SIGTERM) cuts the streams
still in flight with its ``drain_deadline`` event, which the front never relays: it continues each
one on another ready pod. Proven: every stream completes with a ``finish_reason``, none lost, each
answer the uninterrupted sequence; at least one continued (the fronts' own counter, and the
continuations the clients saw join, one for one), none given up or abandoned. From the audit log: the
front calls as its ServiceAccount from its own pods, only ``list`` EndpointSlices and ``get`` its
ModelService (nothing held, so no wake asked for), never refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

# Imported here, not in the scenario: a first import takes seconds, and would stall the event loop
# (the gateway's updates with it) in the middle of the scenario.
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drain_router_dev.fake_model.openai import token_text
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog, Call, service_account
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.kube import MODEL_CHART, Helm, Kube, restart, rolled_out
from e2e.real_engine import REFUSED_PAUSE_SECS

NAMESPACE = "team-a"
RELEASE = "kfront"
MODEL = f"{RELEASE}-drain-router"
"""The model's Deployment, Service and ModelService: the chart's full name."""
FRONT = f"{MODEL}-front"
"""The front's Deployment, Service, ServiceAccount and Role."""
FRONT_USER = service_account(NAMESPACE, FRONT)
FRONT_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=front"
FRONT_PORT = 8080
FRONT_ADMIN_PORT = 9091
HOST = models.hostname(NAMESPACE, RELEASE)
CLIENTS = 8
TOKENS = 160
"""``max_tokens`` of every stream: 8 s at the fake model's pace, longer than a pod's deadline."""
GRACE_SECS = 5
"""The model pods' terminationGracePeriodSeconds and the routers' --termination-grace-secs: their
deadline cuts what is still in flight 3 s after SIGTERM."""
DRAIN_SECS = 2
"""The routers' drain window (above their readiness probe's 1 s), within the deadline."""
GATEWAY_DELAY_SECS = 1.0
PROMPT = "Count:"
STREAM_TIMEOUT_SECS = 60.0
pytestmark = pytest.mark.timeout(600, func_only=True)


def values() -> dict[str, Any]:
    """The fake model behind the routers (two pods, a short grace), its ModelService (a teardown
    without a settle: the scenario's uninstall), and the front with a drain of 2 s (its probe every
    second) so the uninstall is short; everything else of the front as shipped."""
    return models.fake_model_values(
        NAMESPACE, RELEASE, replicas=2, drain_secs=DRAIN_SECS, grace_secs=GRACE_SECS, model_service=True,
        extra={
            "modelService": {"enabled": True, "deletion": {"routeSettle": "0s", "maxWait": "5m"}},
            "front": {
                "enabled": True,
                "shutdownDrainSecs": 2,
                "readinessProbe": {"periodSeconds": 1, "failureThreshold": 1},
            },
        },
    )  # fmt: skip


def uninterrupted() -> str:
    """The answer the fake model gives in one go: `` t0 t1 ... t<TOKENS-1>``."""
    return "".join(token_text(k) for k in range(TOKENS))


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One streamed completion as its client read it."""

    text: str
    finish_reason: str | None
    legs: int
    """The chunks numbered 0 (``seq``): 1, plus one for each continuation that joined."""
    error: str = ""
    """What the SDK raised (the request or the stream), empty when nothing."""

    @property
    def completed(self) -> bool:
        return not self.error and self.finish_reason is not None


async def completion(client: openai.AsyncOpenAI) -> Answer:
    """One streamed completion of :data:`TOKENS` tokens through ``client``, read to its end."""
    try:
        events = await client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=TOKENS, stream=True)
    except openai.APIError as exc:
        return Answer("", None, 0, f"refused: {type(exc).__name__}: {exc}"[:200])
    parts: list[str] = []
    finish: str | None = None
    legs = 0
    try:
        async for chunk in events:
            legs += int((chunk.model_extra or {}).get("seq") == 0)
            for choice in chunk.choices:
                parts.append(choice.text)
                finish = choice.finish_reason or finish
    except Exception as exc:  # whatever the SDK or its transport raised mid-stream: a cut stream
        return Answer("".join(parts), None, legs, f"{type(exc).__name__}: {exc}"[:200])
    return Answer("".join(parts), finish, legs)


@dataclasses.dataclass
class Clients:
    """``count`` OpenAI SDK clients, each streaming completions back to back through ``base_url``
    until :meth:`stop`; no retries (``max_retries=0``), so every failure is seen."""

    base_url: str
    count: int
    answers: list[Answer] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def start(self) -> None:
        for _ in range(self.count):
            client = openai.AsyncOpenAI(
                base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=STREAM_TIMEOUT_SECS,
                default_headers={"Host": HOST},
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(self._run(client)))

    async def _run(self, client: openai.AsyncOpenAI) -> None:
        async with client:
            while not self._stopping:
                answer = await completion(client)
                self.answers.append(answer)
                if answer.error.startswith("refused"):
                    # Load shaping, not synchronisation: a refused user tries again a little later.
                    await asyncio.sleep(REFUSED_PAUSE_SECS)

    @property
    def completed(self) -> int:
        return sum(answer.completed for answer in self.answers)

    async def stop(self) -> list[Answer]:
        """Let every client finish the stream it is in; every answer (again: the same)."""
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), 2 * STREAM_TIMEOUT_SECS)
        return self.answers


async def front_pods(kube: Kube) -> dict[str, str]:
    """The front's running pods: name -> address."""
    pods = await kube.list("Pod", NAMESPACE, FRONT_PODS)
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods if p.get("status", {}).get("podIP")}


async def front_metrics(addresses: list[str]) -> dict[str, float]:
    """The fronts' series of interest, summed over their pods (their admin ``/metrics``)."""
    sums: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for address in addresses:
            async with session.get(f"http://{address}:{FRONT_ADMIN_PORT}/metrics") as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.startswith("drain_router_front_continuations"):
                        key = f"{sample.name}:{sample.labels.get('outcome', '')}"
                    elif sample.name == "drain_router_front_ready_pods":
                        key = f"ready_pods:{address}"
                    else:
                        continue
                    sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def continued(metrics: dict[str, float], outcome: str) -> int:
    return int(metrics.get(f"drain_router_front_continuations_total:{outcome}", 0))


async def uninstall(kube: Kube, helm: Helm) -> None:
    """The front's pods first, then the release. ``helm uninstall`` deletes the front's Role and
    RoleBinding with its Deployment, while the front's pods still drain (``shutdownDrainSecs``, then
    the streams they hold) and poll the API server every second: each poll is refused (403) until
    they exit, and the front keeps the pods it last listed. The session's RBAC audit
    (``test_rbac_audit.py``) would take those refusals for a missing rule."""
    try:
        await kube.delete("Deployment", NAMESPACE, FRONT)

        async def gone() -> bool:
            return not await kube.list("Pod", NAMESPACE, FRONT_PODS)

        await kube.wait("the front's pods gone", gone)
    finally:
        helm.uninstall(RELEASE, NAMESPACE)


def from_front_pod(call: Call) -> bool:
    """Sent with a token bound to a pod of the front's Deployment (``<deployment>-<hash>-<suffix>``)."""
    return re.fullmatch(rf"{re.escape(FRONT)}-[a-z0-9]+-[a-z0-9]+", call.pod) is not None


async def test_a_rollout_under_the_front_continues_the_cut_streams(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    started = time.monotonic()
    audit = AuditLog(kube.cluster.audit_log)
    helm.install(RELEASE, MODEL_CHART, NAMESPACE, values())
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=GATEWAY_DELAY_SECS)
    await gateway.start()
    clients = Clients(gateway.url, CLIENTS)
    try:

        async def routed_to_the_fronts() -> list[str] | None:
            """The gateway sends the route's requests to the front's two pods (the HTTPRoute's
            backendRef), not to the model's pods."""
            addresses = sorted((await front_pods(kube)).values())
            served = sorted(gateway.servers(HOST))
            return addresses if len(addresses) == 2 and served == [(a, FRONT_PORT) for a in addresses] else None

        fronts = await kube.wait("the gateway sending to the front's two pods", routed_to_the_fronts)

        async def both_model_pods_ready_at_each_front() -> bool:
            metrics = await front_metrics(fronts)
            return all(metrics.get(f"ready_pods:{address}") == 2 for address in fronts)

        await kube.wait("each front pod with both model pods ready", both_model_pods_ready_at_each_front)
        clients.start()

        async def completed(count: int) -> bool:
            return clients.completed >= count

        await kube.wait("streams completed before the rollout", lambda: completed(CLIENTS))
        rollout_started = time.monotonic()
        generation = await restart(kube, NAMESPACE, MODEL)
        await rolled_out(kube, NAMESPACE, MODEL, generation, replicas=2)
        rollout_secs = time.monotonic() - rollout_started
        # Streams on the new pods alone, completed too.
        before = clients.completed
        await kube.wait("streams completed after the rollout", lambda: completed(before + CLIENTS))
        answers = await clients.stop()
        metrics = await front_metrics(fronts)
    finally:
        await clients.stop()
        await gateway.stop()
        await uninstall(kube, helm)

    lost = [a for a in answers if not a.completed]
    whole = uninterrupted()
    wrong = [a.text[-80:] for a in answers if a.completed and a.text != whole]
    joined = sum(a.legs - 1 for a in answers)
    report.append(
        f"{len(answers)} streams, {len(lost)} lost, {continued(metrics, 'continued')} continued "
        f"({sum(a.legs > 1 for a in answers)} streams continued, {joined} joins seen by the clients), "
        f"{len(answers) - len(lost) - len(wrong)} the uninterrupted answer; rollout {rollout_secs:.1f} s, "
        f"scenario {time.monotonic() - started:.0f} s"
    )
    assert not lost, lost[:5]
    assert not wrong, wrong[:5]
    assert continued(metrics, "continued") >= 1, f"no stream was cut and continued: {metrics}"
    assert joined == continued(metrics, "continued"), metrics
    assert continued(metrics, "given_up") == continued(metrics, "abandoned") == 0, metrics

    calls = audit.by(FRONT_USER)
    kinds = sorted({(c.verb, c.group, c.rule_resource, c.name) for c in calls})
    report.append(f"the front's API calls: {len(calls)}, {kinds}")
    assert calls, "the front never called the API server as its ServiceAccount"
    assert all(from_front_pod(c) for c in calls), [str(c) for c in calls if not from_front_pod(c)][:5]
    refused = [str(c) for c in calls if c.code == 403 or c.decision == "forbid"]
    assert not refused, refused[:10]
    assert {(verb, group, resource) for verb, group, resource, _ in kinds} == {
        ("list", "discovery.k8s.io", "endpointslices"),
        ("get", "drainrouter.dev", "modelservices"),
    }, kinds
    assert {name for verb, _, _, name in kinds if verb == "get"} == {MODEL}, kinds
    assert {c.namespace for c in calls} == {NAMESPACE}, calls[:5]
