"""Scale to zero and wake on a request, on the real control plane, without the user's objects ever
being written: the activator becomes an endpoint of the model's Service while it sleeps.

The model chart renders a ModelService with a ScaleToZero rule after a few idle seconds; the
controller chart runs the controller with ``--activator-service`` and the activator (two replicas).
One stream per client makes the routers have served; once they have been idle long enough the
controller assigns the service a port on the activator (the port map, ConfigMap
``<activator>-ports``), writes an EndpointSlice of its own for the model Service
(``<service>-drain-router``, ``kubernetes.io/service-name: <service>``, managed by drain-router)
whose endpoints are the activator's pods on that port, and only once it reads that slice back ready
scales the Deployment to 0; the real Deployment, ReplicaSet and EndpointSlice controllers remove
the pods and empty the Service's own slices. The same OpenAI SDK streaming clients then send again:
whatever sends them to the Service's endpoints sends them to the activator, which holds them and
writes ``wakeRequestedAt``; the controller scales the Deployment back, the activator forwards the
held requests to the first router that answers ready, and once a model pod is Ready and its router
serves the controller deletes its slice. The clients keep streaming back to back until each has
completed two streams sent after the data plane dropped the activator.

Two ways in for HTTP, each a scenario (:data:`WAYS`):

- **gateway**: a HAProxy fed from the HTTPRoute, Services and EndpointSlices (:mod:`.gateway`), 0 and
  2 s late. The route is the user's and never changes: only the endpoints behind it do (HAProxy's
  runtime API, never a reload).
- **service**: no route at all; the clients connect to the model Service's ClusterIP, which
  kube-proxy (iptables mode, ``--masquerade-all``) DNATs to one of the Service's ready endpoints:
  the activator's while it sleeps, the pods' once awake. Its rules are read with ``iptables-save``.

In the gateway scenario at 2 s a GitOps loop (:class:`GitOps`) applies the user's HTTPRoute and
Service every second, as the model chart renders them (a server-side apply, what ``kubectl apply
--server-side`` sends) and as read at install (a PUT of the same content): nothing moves.

What is asserted comes from the API server: a watch on the EndpointSlices, the Deployment, the pods,
the ModelService, the Service and the route, replayed in resourceVersion order (:mod:`.history`), so
each write is seen with every other object as the API server held it then; and its audit log for
who wrote what. Every assertion about the user's objects and the Service's endpoints is in
:class:`Wake`. No stream is lost (each ends with a ``finish_reason``); the cold start is measured as
the clients saw it (first request sent to the activator -> its first byte) beside the controller's
``coldStartSeconds`` and the activator's ``activation_seconds``.

And gRPC (:func:`test_a_grpc_call_wakes_a_service_scaled_to_zero`), vLLM's ``Generate`` on the fake
model, two ways: through the gateway and the user's GRPCRoute (HTTP/2 on both sides), and to the
Service's ``grpc`` port (``appProtocol: kubernetes.io/h2c``) through its ClusterIP. The service gets
an activator port per protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from drain_router.decisions import durations, service_ports, wake_endpoints
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog, service_account
from e2e.kubernetes.conftest import CONTROLLER_USER
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.history import History
from e2e.kubernetes.kube import MODEL_CHART, Helm, Json, Kube, is_ready, path
from e2e.kubernetes.wake import Wake, kube_proxy_destinations, ready_addresses, slices_of, writes_to_users_objects
from e2e.real_engine import Outcome, Record, request_body

NAMESPACE = "team-a"
REPLICAS = 2
IDLE_SECS = 3
"""The ScaleToZero rule's idle time: longer than any gap between two of a client's streams."""
CLIENTS = 6
MAX_TOKENS = models.CHUNKS
AFTER_RETURN = 2
"""Streams each client completes, sent after the data plane dropped the activator."""
ACTIVATOR_NAMESPACE = "drain-router-system"
ACTIVATOR = "ctl-drain-router-controller-activator"
ACTIVATOR_ADMIN_PORT = 9091
ACTIVATOR_USER = service_account(ACTIVATOR_NAMESPACE, ACTIVATOR)
PORT_MAP = service_ports.configmap_name(ACTIVATOR)
WATCHED = ("EndpointSlice", "Deployment", "Pod", "ModelService", "Service", "HTTPRoute", "GRPCRoute")
GITOPS_PERIOD_SECS = 1.0
pytestmark = pytest.mark.timeout(600, func_only=True)


def values(namespace: str, release: str, *, route: bool) -> dict[str, Any]:
    """The fake model chart's values with the ModelService: ScaleToZero after :data:`IDLE_SECS`, and
    a teardown without a settle (the scenario's uninstall). ``route``: an HTTPRoute, or none."""
    extra: dict[str, Any] = {
        "modelService": {
            "enabled": True,
            "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": IDLE_SECS}}],
            "activationTimeoutSeconds": 120,
            "deletion": {"routeSettle": "0s", "maxWait": "5m"},
        }
    }
    if not route:
        extra["httpRoute"] = {"enabled": False}
    return models.fake_model_values(namespace, release, replicas=REPLICAS, model_service=True, extra=extra)


@dataclasses.dataclass(frozen=True)
class Timed:
    """One stream: which client, its place in that client's sequence, when it was sent and its first
    chunk arrived (monotonic), and how it ended."""

    client: int
    index: int
    sent: float
    first_byte: float | None
    record: Record


async def timed_stream(client: Any, number: int, index: int) -> Timed:
    """One streamed chat completion, classified as :func:`e2e.real_engine.sdk_stream` does, with the
    time of its first chunk."""
    import openai

    sent = time.monotonic()
    first: float | None = None
    try:
        stream = await client.chat.completions.create(stream=True, **request_body(MAX_TOKENS))
    except openai.APIError as exc:
        record = Record(Outcome.REFUSED, time.monotonic() - sent, f"{type(exc).__name__}: {exc}"[:200])
        return Timed(number, index, sent, None, record)
    finish: str | None = None
    try:
        async for chunk in stream:
            first = time.monotonic() if first is None else first
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except Exception as exc:  # whatever the SDK or its transport raised mid-stream: a cut stream
        record = Record(Outcome.TRUNCATED, time.monotonic() - sent, f"{type(exc).__name__}: {exc}"[:200])
        return Timed(number, index, sent, first, record)
    outcome = Outcome.COMPLETED if finish is not None else Outcome.TRUNCATED
    return Timed(number, index, sent, first, Record(outcome, time.monotonic() - sent, finish or "no finish_reason"))


@dataclasses.dataclass
class Clients:
    """``count`` OpenAI SDK clients of ``base_url`` (``host``: the Host header, for the gateway), no
    retries, each with its own connection pool, kept for the whole scenario as an application keeps
    its client: one stream each (:meth:`once`), quiet while the service sleeps, then back to back
    from :meth:`start` to :meth:`stop`."""

    base_url: str
    host: str | None
    count: int
    streams: list[Timed] = dataclasses.field(default_factory=list)
    _clients: list[Any] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        import openai

        headers = {"Host": self.host} if self.host else None
        url = f"{self.base_url}/v1"
        self._clients = [
            openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=120.0, default_headers=headers)
            for _ in range(self.count)
        ]

    async def _one(self, number: int) -> Timed:
        index = sum(1 for s in self.streams if s.client == number)
        timed = await timed_stream(self._clients[number], number, index)
        self.streams.append(timed)
        return timed

    async def once(self) -> list[Timed]:
        return list(await asyncio.gather(*(self._one(n) for n in range(self.count))))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(n)) for n in range(self.count)]

    async def _run(self, number: int) -> None:
        while not self._stopping:
            await self._one(number)

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), 150)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

    def completed_after(self, moment: float) -> bool:
        """Every client completed :data:`AFTER_RETURN` streams sent after ``moment``."""
        done = [
            sum(1 for s in self.streams if s.client == n and s.sent > moment and s.record.outcome is Outcome.COMPLETED)
            for n in range(self.count)
        ]
        return min(done) >= AFTER_RETURN


@dataclasses.dataclass
class GitOps:
    """A GitOps tool keeping the user's objects as declared: every :data:`GITOPS_PERIOD_SECS`, each
    object of ``rendered`` (the model chart's manifest) server-side applied under its own field
    manager, and each of ``stored`` (as read at install, resourceVersion included) PUT back. Every
    answer's resourceVersion is kept: a write by anyone else moves it (or fails the PUT with 409)."""

    kube: Kube
    rendered: list[Json]
    stored: list[Json]
    manager: str = "gitops"
    versions: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    rounds: int = 0
    _task: asyncio.Task[None] | None = None

    async def sync(self) -> None:
        for obj in self.rendered:
            applied = await self.kube.apply(obj, manager=self.manager)
            self._keep(f"apply {obj['kind']}", applied)
        for obj in self.stored:
            meta = obj["metadata"]
            where = path(obj["kind"], meta["namespace"], meta["name"])
            _, put = await self.kube.api.request("PUT", where, obj)
            self._keep(f"put {obj['kind']}", put)
        self.rounds += 1

    def _keep(self, what: str, answer: Json) -> None:
        self.versions.setdefault(what, set()).add(answer["metadata"]["resourceVersion"])

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(GITOPS_PERIOD_SECS)  # the tool's period, not a wait for anything

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def rendered(helm: Helm, release: str, namespace: str, kinds: set[str]) -> list[Json]:
    """The release's manifest as the chart rendered it (``helm get manifest``), its objects of ``kinds``."""
    docs = yaml.safe_load_all(helm.run("get", "manifest", release, "-n", namespace))
    return [
        {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        for doc in docs
        if doc and doc.get("kind") in kinds
    ]


async def activator_metrics(addresses: set[str]) -> dict[str, float]:
    """The activators' counters of interest, summed over their pods (their admin ``/metrics``)."""
    wanted = {
        "drain_router_activations_total": "activations",
        "drain_router_activation_seconds_sum": "activation_seconds_sum",
        "drain_router_activator_held_requests": "held",
    }
    sums = dict.fromkeys(wanted.values(), 0.0)
    async with aiohttp.ClientSession() as session:
        for address in sorted(addresses):
            url = f"http://{address}:{ACTIVATOR_ADMIN_PORT}/metrics"
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in wanted:
                        sums[wanted[sample.name]] += sample.value
    return sums


def audited(audit_log: Path, resource: str, name: str, subresource: str, user: str) -> list[int]:
    """The answer codes of every PATCH ``user`` sent to ``resource``/``name`` (``subresource``)."""
    return [
        c.code
        for c in AuditLog(audit_log, whole=True).by(user)
        if c.verb == "patch" and (c.resource, c.name, c.subresource) == (resource, name, subresource)
    ]


def kube_proxy(namespace: str, service: str, port: str) -> set[tuple[str, int]]:
    """Where kube-proxy sends a connection to the Service's ``port`` now."""
    out = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True, timeout=10)
    return kube_proxy_destinations(out.stdout, namespace, service, port)


async def _async(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Way:
    """How the clients reach the service."""

    name: str
    route: bool
    """Through the gateway and the HTTPRoute; otherwise to the Service's ClusterIP."""
    delay: float = 0.0
    """The gateway's propagation delay."""
    gitops: bool = False
    ready_delay: int = 0
    """The woken pods' readiness probe's ``initialDelaySeconds``: a slow cold start, longer than the
    controller's passes, so a slice deleted before a pod is Ready would show."""
    activator_rollout: bool = False
    """While asleep, the activator's Deployment restarted: the slice must follow its new pods."""


WAYS = [
    Way("gateway-0s", route=True),
    Way("gateway-2s-gitops-slow-start", route=True, delay=2.0, gitops=True, ready_delay=8),
    Way("service-clusterip-activator-rollout", route=False, activator_rollout=True),
]


class DataPlane:
    """Where requests for the service go now: the gateway's servers for the host, or kube-proxy's
    destinations for the Service's ``http`` port (address, port)."""

    def __init__(self, gateway: Gateway | None, host: str, namespace: str, service: str) -> None:
        self.gateway, self.host, self.namespace, self.service = gateway, host, namespace, service

    def servers(self) -> set[tuple[str, int]]:
        if self.gateway is not None:
            return set(self.gateway.servers(self.host))
        return kube_proxy(self.namespace, self.service, "http")

    def at(self, wanted: set[tuple[str, int]]) -> bool:
        return self.servers() == wanted


@pytest.mark.parametrize("way", WAYS, ids=[w.name for w in WAYS])
async def test_a_request_wakes_a_service_scaled_to_zero(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, way: Way, report: list[str]
) -> None:
    """1. two pods serve one stream, then idle. Result: the activator's slice on the Service with a
    ready endpoint per activator pod on the service's port, then the Deployment at 0, its pods gone,
    the Service's own slices empty, phase ScaledToZero, and the data plane (the gateway, or
    kube-proxy) sending to the activator alone.
    2. six SDK clients stream back to back. Result: the activator holds the first requests and asks
    for a wake (its own PATCH of the status subresource), the Deployment back at 2, the activator's
    slice deleted once a pod is Ready, phase Active; every stream, held or not, ends with a
    finish_reason, two per client sent after the data plane dropped the activator among them.
    Throughout: the route and the Service as installed, byte for byte, and no write to them (nor to
    any route, Service or ReferenceGrant) by the controller or the activator."""
    release = {"gateway-0s": "kd0", "gateway-2s-gitops-slow-start": "kd2", "service-clusterip-activator-rollout": "ks"}[
        way.name
    ]
    name = f"{release}-drain-router"  # the Deployment, Service, HTTPRoute and ModelService alike
    host = models.hostname(NAMESPACE, release)
    assert await kube.get("Service", ACTIVATOR_NAMESPACE, ACTIVATOR) is not None, "the activator's Service"
    chart_values = values(NAMESPACE, release, route=way.route)
    chart_values["router"]["readinessProbe"]["initialDelaySeconds"] = way.ready_delay
    helm.install(release, MODEL_CHART, NAMESPACE, chart_values)
    started = time.monotonic()
    audit = AuditLog(kube.cluster.audit_log)
    user_kinds = {"Service", "HTTPRoute"} if way.route else {"Service"}
    gitops: GitOps | None = None
    gateway: Gateway | None = None
    clients: Clients | None = None
    history = History(kube.api, NAMESPACE, WATCHED)
    try:
        pods = await kube.wait(
            "the Service's own slices ready", lambda: _ready(kube, NAMESPACE, name, REPLICAS), timeout=60
        )
        if way.gitops:
            # The tool's first sync co-owns the fields it declares (its entry in managedFields: one
            # write, its own); the objects' versions are read after it.
            gitops = GitOps(kube, rendered(helm, release, NAMESPACE, user_kinds), [])
            await gitops.sync()
        originals = {kind: await kube.get(kind, NAMESPACE, name) for kind in user_kinds}
        assert all(originals.values()), originals
        wake = Wake(NAMESPACE, name, release, {k: v for k, v in originals.items() if v is not None})
        if gitops is not None:
            gitops = dataclasses.replace(gitops, stored=list(wake.originals.values()), versions={}, rounds=0)
            gitops.start()
        await history.start()
        service = wake.originals["Service"]
        (http_port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
        router_port = (await kube.get("ModelService", NAMESPACE, name) or {})["spec"]["router"]["port"]
        if way.route:
            gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=way.delay)
            await gateway.start()
            base_url, client_host = gateway.url, host
        else:
            base_url, client_host = f"http://{service['spec']['clusterIP']}:{http_port}", None
        plane = DataPlane(gateway, host, NAMESPACE, name)
        at_pods = {(address, router_port) for address in pods}
        await kube.wait("the data plane sending to both pods", lambda: _async(plane.at(at_pods)))

        # 1. One stream per client, so the routers have served; then quiet until asleep.
        clients = Clients(base_url, client_host, CLIENTS)
        warm = await clients.once()
        assert all(s.record.outcome is Outcome.COMPLETED for s in warm), warm
        idle_from = time.monotonic()
        msvc = await kube.wait("phase ScaledToZero", lambda: _phase(kube, name, "ScaledToZero"), timeout=90)
        asleep_at = time.monotonic()
        assert msvc["status"]["lifecycle"]["replicasBeforeZero"] == REPLICAS
        await kube.wait("the Deployment at 0, its pods gone", lambda: _scaled(kube, name, 0, release), timeout=90)
        await kube.wait("the Service's own slices empty", lambda: _no_pod_endpoints(kube, name), timeout=90)
        activators = await kube.wait("the activator's endpoints", lambda: _ready(kube, ACTIVATOR_NAMESPACE, ACTIVATOR))
        ports = await assigned_ports(kube, NAMESPACE, name)
        # The slice names the activator pods that listen on the service's port when it is written
        # (one may not have read the port map yet); the controller keeps it in step with them.
        await kube.wait(
            "the activator's slice naming every activator pod",
            lambda: _activator_slice_at(kube, name, activators),
            timeout=30,
        )
        assert set(ports) == {"http"}, ports
        wake.check_asleep(await kube.list("EndpointSlice", NAMESPACE), service, ports, activators)
        policy = await kube.get("NetworkPolicy", ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, name))
        rolled = ""
        if way.activator_rollout:
            # What `kubectl rollout restart` writes; the Deployment controller rolls the pods.
            restarted = {"kubectl.kubernetes.io/restartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            patch = {"spec": {"template": {"metadata": {"annotations": restarted}}}}
            restart_at = time.monotonic()
            await kube.patch("Deployment", ACTIVATOR_NAMESPACE, ACTIVATOR, patch)
            old = activators
            activators = await kube.wait(
                "the activator rolled: new pods ready, the old ones gone", lambda: _activator_rolled(kube, old), 120
            )
            await kube.wait(
                "the activator's slice following the new activator pods",
                lambda: _activator_slice_at(kube, name, activators),
                timeout=60,
            )
            rolled = (
                f"; activator restarted while asleep, the slice on its new pods {time.monotonic() - restart_at:.2f} s "
                "after the restart"
            )
            wake.check_asleep(await kube.list("EndpointSlice", NAMESPACE), service, ports, activators)
        at_activator = {(address, ports["http"]) for address in activators}
        await kube.wait("the data plane sending to the activator", lambda: _async(plane.at(at_activator)))
        before = await activator_metrics(activators)

        # 2. The same clients stream again: to the activator, which wakes it.
        woken_from = len(clients.streams)
        clients.start()
        msvc = await kube.wait("phase Active", lambda: _phase(kube, name, "Active"), timeout=150)
        await kube.wait("the Deployment back at 2", lambda: _scaled(kube, name, REPLICAS, release), timeout=90)
        await kube.wait_gone("EndpointSlice", NAMESPACE, wake.slice_name, timeout=30)
        pods = await kube.wait(
            "the Service's own slices ready", lambda: _ready(kube, NAMESPACE, name, REPLICAS), timeout=90
        )
        at_pods = {(address, router_port) for address in pods}
        await kube.wait("the data plane sending to the pods", lambda: _async(plane.at(at_pods)), timeout=30)
        returned = time.monotonic()
        await kube.wait(
            f"{AFTER_RETURN} streams per client after the data plane dropped the activator",
            lambda: _async(clients.completed_after(returned)),
            timeout=120,
        )
        await history.stop()  # before the load stops: the next sleep is not this scenario's
        if gitops is not None:
            await gitops.stop()
        await clients.stop()
        after = await activator_metrics(activators)
        now = {kind: await kube.get(kind, NAMESPACE, name) for kind in user_kinds}
        written = writes_to_users_objects(audit.calls(), (CONTROLLER_USER, ACTIVATOR_USER))

        lost = [s for s in clients.streams if s.record.outcome is not Outcome.COMPLETED]
        first = [s for s in clients.streams if s.index == 1]  # held: each client's first after the warm one
        cold = min(s.first_byte or float("inf") for s in first) - min(s.sent for s in first)
        last = max(s.first_byte or float("inf") for s in first) - min(s.sent for s in first)
        lifecycle = msvc["status"]["lifecycle"]
        asked = durations.parse_time(lifecycle["wakeRequestedAt"])
        awoken = durations.parse_time(lifecycle["awokenAt"])
        wake_patches = audited(kube.cluster.audit_log, "modelservices", name, "status", ACTIVATOR_USER)
        margins = wake.check_history(history)
        replicas = _replicas(history, name)
        held = after["activation_seconds_sum"] - before["activation_seconds_sum"]
        activations = after["activations"] - before["activations"]
        synced = (
            f"; GitOps: {gitops.rounds} syncs, resourceVersions answered {dict(sorted(gitops.versions.items()))}"
            if gitops is not None
            else ""
        )
        report.append(
            f"wake, {way.name}: {len(clients.streams) - woken_from} streams after the sleep ({CLIENTS} before), "
            f"{len(lost)} lost; asleep {asleep_at - idle_from:.1f} s after the warm stream; activator port "
            f"{ports['http']}; cold start (first request sent -> first byte) {cold:.2f} s, all {CLIENTS} held "
            f"answered by {last:.2f} s; controller coldStartSeconds {lifecycle['coldStartSeconds']:.2f}; "
            f"activator activation_seconds {held:.2f} over {activations:.0f} activations; wake PATCHes by the "
            f"activator {wake_patches}; {margins}; replicas {replicas}; "
            f"gateway reloads {gateway.reloads if gateway else '-'}; writes to the user's objects by the "
            f"controller or the activator: {len(written)}{synced}{rolled}; {time.monotonic() - started:.0f} s"
        )
        wake.check_unchanged(now)
        assert not written, written
        assert policy is not None and {p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]} == set(
            ports.values()
        ), policy
        assert not lost, lost[:5]
        assert {s.record.detail for s in clients.streams} <= {"length", "stop"}  # each its finish_reason
        assert len(first) == CLIENTS and all(s.first_byte is not None for s in first)
        assert replicas == [REPLICAS, 0, REPLICAS], replicas
        assert lifecycle["coldStartSeconds"] > 0 and awoken > asked
        assert 200 in wake_patches, "the wake was not asked for by the activator"
        assert 1 <= activations <= len(activators) and after["held"] == 0, (before, after)
        if gateway is not None:
            assert gateway.reloads == 0, "the gateway reloaded: a route changed"
        if gitops is not None:
            assert gitops.rounds >= 10, gitops.rounds
            installed = {k: v["metadata"]["resourceVersion"] for k, v in wake.originals.items()}
            assert gitops.versions == {f"{verb} {k}": {v} for k, v in installed.items() for verb in ("apply", "put")}
    finally:
        if gitops is not None:
            await gitops.stop()
        if clients is not None:
            if clients._tasks and not clients._stopping:
                await clients.stop()
            await clients.close()
        await history.stop()
        if gateway is not None:
            await gateway.stop()
        helm.uninstall(release, NAMESPACE)
        await kube.wait_gone("Deployment", NAMESPACE, name, timeout=120)


async def assigned_ports(kube: Kube, namespace: str, name: str) -> dict[str, int]:
    """The service's activator ports by protocol, from the port map."""
    found = await kube.get("ConfigMap", ACTIVATOR_NAMESPACE, PORT_MAP)
    assert found is not None, f"no port map {ACTIVATOR_NAMESPACE}/{PORT_MAP}"
    table = service_ports.parse(found.get("data"))
    return {a.protocol: port for port, a in table.items() if (a.namespace, a.name) == (namespace, name)}


async def _phase(kube: Kube, name: str, phase: str) -> Json | None:
    found = await kube.get("ModelService", NAMESPACE, name)
    if found is not None and ((found.get("status") or {}).get("lifecycle") or {}).get("phase") == phase:
        return found
    return None


async def _scaled(kube: Kube, name: str, replicas: int, release: str) -> bool:
    """The Deployment's ``spec.replicas`` at ``replicas`` and exactly that many pods, all Ready."""
    found = await kube.get("Deployment", NAMESPACE, name)
    if found is None or found["spec"]["replicas"] != replicas:
        return False
    selector = f"app.kubernetes.io/instance={release}"
    pods = await kube.list("Pod", NAMESPACE, selector)
    return len(pods) == replicas and all(is_ready(p) for p in pods)


async def _activator_rolled(kube: Kube, old: set[str]) -> set[str] | None:
    """The activator's pods all new (none of ``old``'s addresses, none terminating) and ready, as its
    Service's endpoints: their addresses."""
    selector = "app.kubernetes.io/instance=ctl,app.kubernetes.io/component=activator"
    pods = await kube.list("Pod", ACTIVATOR_NAMESPACE, selector)
    addresses = {p.get("status", {}).get("podIP") for p in pods}
    if len(pods) != 2 or not all(is_ready(p) for p in pods) or addresses & old:
        return None
    found = await _ready(kube, ACTIVATOR_NAMESPACE, ACTIVATOR)
    return found if found == addresses else None


async def _activator_slice_at(kube: Kube, service: str, activators: set[str]) -> bool:
    return ready_addresses(await kube.list("EndpointSlice", NAMESPACE), service, ours=True) == activators


async def _no_pod_endpoints(kube: Kube, service: str) -> bool:
    return not any(
        item.get("endpoints") for item in slices_of(await kube.list("EndpointSlice", NAMESPACE), service, ours=False)
    )


async def _ready(kube: Kube, namespace: str, service: str, count: int = 1) -> set[str] | None:
    """The ready addresses of ``service``'s own slices (the EndpointSlice controller's), once there
    are at least ``count``."""
    found = ready_addresses(await kube.list("EndpointSlice", namespace), service, ours=False)
    return found if len(found) >= count else None


def _replicas(history: History, name: str) -> list[int]:
    """The Deployment's successive ``spec.replicas``, repeats folded."""
    seen: list[int] = []
    for deployment in history.versions("Deployment", name):
        if not seen or seen[-1] != deployment["spec"]["replicas"]:
            seen.append(deployment["spec"]["replicas"])
    return seen


GRPC_TOKENS = 20
GRPC_WAYS = ["grpcroute", "service-clusterip"]
GRPC_MODEL_PORT = 8001
"""The fake model's gRPC port in the pod (vLLM's engine service): the router's ``--grpc-upstream``."""


def grpc_values(namespace: str, release: str, *, route: bool) -> dict[str, Any]:
    """:func:`values` with no HTTPRoute, the router's gRPC listener and the Service's ``grpc`` port
    (``appProtocol: kubernetes.io/h2c``), the fake model serving vLLM's engine service. ``route``: a
    GRPCRoute (the release's hostname, every method) to that port, or none."""
    found = values(namespace, release, route=False)
    found["modelServer"]["args"] = [*found["modelServer"]["args"], "--grpc-port", str(GRPC_MODEL_PORT)]
    found["grpc"] = {"enabled": True, "modelServerPort": GRPC_MODEL_PORT}
    if route:
        found["grpcRoute"] = {
            "enabled": True,
            "parentRefs": [{"name": "gateway"}],
            "hostnames": [models.hostname(namespace, release)],
        }
    return found


@dataclasses.dataclass(frozen=True)
class Called:
    client: int
    index: int
    sent: float
    ended: float
    outcome: Any
    """:class:`drain_router_dev.grpc_load.Outcome`."""
    detail: str


@dataclasses.dataclass
class GrpcClients:
    """``count`` gRPC clients of ``target`` (one channel each: one HTTP/2 connection, as one
    application's client has), calling vLLM's ``Generate`` (server streaming) with no retry policy
    and no wait-for-ready: once each (:meth:`once`), then back to back from :meth:`start` to
    :meth:`stop`. ``authority``: the ``:authority`` they send (the route's hostname), when not the
    target's."""

    target: str
    count: int
    authority: str | None = None
    calls: list[Called] = dataclasses.field(default_factory=list)
    _channels: list[Any] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        import grpc

        options = [("grpc.default_authority", self.authority)] if self.authority else None
        self._channels = [grpc.aio.insecure_channel(self.target, options=options) for _ in range(self.count)]

    async def _one(self, number: int) -> Called:
        from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

        from drain_router_dev import grpc_load

        index = sum(1 for c in self.calls if c.client == number)
        stub = pb_grpc.VllmEngineStub(self._channels[number])
        sent = time.monotonic()
        result = await grpc_load.generate(stub, f"c{number}-{index}", tokens=GRPC_TOKENS, timeout=120.0)
        called = Called(number, index, sent, time.monotonic(), grpc_load.classify(result), result.code)
        self.calls.append(called)
        return called

    async def once(self) -> list[Called]:
        return list(await asyncio.gather(*(self._one(n) for n in range(self.count))))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(n)) for n in range(self.count)]

    async def _run(self, number: int) -> None:
        while not self._stopping:
            await self._one(number)

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), 150)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    def completed_after(self, moment: float) -> bool:
        done = [
            sum(1 for c in self.calls if c.client == n and c.sent > moment and not c.outcome.lost)
            for n in range(self.count)
        ]
        return min(done) >= AFTER_RETURN


@pytest.mark.parametrize("via", GRPC_WAYS)
async def test_a_grpc_call_wakes_a_service_scaled_to_zero(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, via: str, report: list[str]
) -> None:
    """The same sleep and wake for gRPC clients, ``via`` the gateway and the user's GRPCRoute, or the
    model Service's ``grpc`` port (its ClusterIP, through kube-proxy). Result: the service given one
    activator port per protocol, the activator's slice mapping the ``http`` and ``grpc`` ports to
    them; held calls complete whole (every token, in order, then ``complete``) once a pod serves; the
    same invariants from the history and the audit log as the HTTP scenarios; the Service and the
    GRPCRoute as installed, byte for byte."""
    route = via == "grpcroute"
    release = "kgr" if route else "kg"
    name = f"{release}-drain-router"
    host = models.hostname(NAMESPACE, release)
    helm.install(release, MODEL_CHART, NAMESPACE, grpc_values(NAMESPACE, release, route=route))
    started = time.monotonic()
    audit = AuditLog(kube.cluster.audit_log)
    history = History(kube.api, NAMESPACE, WATCHED)
    clients: GrpcClients | None = None
    gateway: Gateway | None = None
    try:
        pods = await kube.wait(
            "the Service's own slices ready", lambda: _ready(kube, NAMESPACE, name, REPLICAS), timeout=60
        )
        user_kinds = ("Service", "GRPCRoute") if route else ("Service",)
        originals = {kind: await kube.get(kind, NAMESPACE, name) for kind in user_kinds}
        assert all(originals.values()), originals
        wake = Wake(NAMESPACE, name, release, {k: v for k, v in originals.items() if v is not None})
        service = wake.originals["Service"]
        await history.start()
        (grpc_port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
        msvc = await kube.get("ModelService", NAMESPACE, name)
        assert msvc is not None
        router_grpc = msvc["spec"]["router"]["grpcPort"]
        plane = DataPlane(None, "", NAMESPACE, name)
        if route:
            gateway = Gateway(kube.api, haproxy_bin, tmp_path)
            await gateway.start()
            target, authority = gateway.grpc_target, host
        else:
            target, authority = f"{service['spec']['clusterIP']}:{grpc_port}", None

        def grpc_at(wanted: set[tuple[str, int]]) -> bool:
            if gateway is not None:
                return set(gateway.servers(host, grpc=True)) == wanted
            return kube_proxy(NAMESPACE, name, "grpc") == wanted

        await kube.wait(f"{via}: gRPC sent to both pods", lambda: _async(grpc_at({(a, router_grpc) for a in pods})))

        clients = GrpcClients(target, CLIENTS, authority)
        warm = await clients.once()
        assert all(not c.outcome.lost for c in warm), warm
        idle_from = time.monotonic()
        await kube.wait("phase ScaledToZero", lambda: _phase(kube, name, "ScaledToZero"), timeout=90)
        asleep_at = time.monotonic()
        await kube.wait("the Deployment at 0, its pods gone", lambda: _scaled(kube, name, 0, release), timeout=90)
        await kube.wait("the Service's own slices empty", lambda: _no_pod_endpoints(kube, name), timeout=90)
        activators = await kube.wait("the activator's endpoints", lambda: _ready(kube, ACTIVATOR_NAMESPACE, ACTIVATOR))
        ports = await assigned_ports(kube, NAMESPACE, name)
        assert set(ports) == {"http", "grpc"}, ports
        await kube.wait(
            "the activator's slice naming every activator pod",
            lambda: _activator_slice_at(kube, name, activators),
            timeout=30,
        )
        wake.check_asleep(await kube.list("EndpointSlice", NAMESPACE), service, ports, activators)
        await kube.wait(
            f"{via}: gRPC sent to the activator",
            lambda: _async(grpc_at({(a, ports["grpc"]) for a in activators})),
        )
        assert plane.at({(a, ports["http"]) for a in activators})

        woken_from = len(clients.calls)
        clients.start()
        msvc = await kube.wait("phase Active", lambda: _phase(kube, name, "Active"), timeout=150)
        await kube.wait("the Deployment back at 2", lambda: _scaled(kube, name, REPLICAS, release), timeout=90)
        await kube.wait_gone("EndpointSlice", NAMESPACE, wake.slice_name, timeout=30)
        pods = await kube.wait(
            "the Service's own slices ready", lambda: _ready(kube, NAMESPACE, name, REPLICAS), timeout=90
        )
        await kube.wait(
            f"{via}: gRPC sent to the pods", lambda: _async(grpc_at({(a, router_grpc) for a in pods})), timeout=30
        )
        returned = time.monotonic()
        await kube.wait(
            f"{AFTER_RETURN} calls per client after the data plane dropped the activator",
            lambda: _async(clients.completed_after(returned)),
            timeout=120,
        )
        await history.stop()
        await clients.stop()
        now = {kind: await kube.get(kind, NAMESPACE, name) for kind in user_kinds}
        written = writes_to_users_objects(audit.calls(), (CONTROLLER_USER, ACTIVATOR_USER))
        lost = [c for c in clients.calls if c.outcome.lost]
        held = [c for c in clients.calls if c.index == 1]
        first_done = min(c.ended for c in held) - min(c.sent for c in held)
        lifecycle = msvc["status"]["lifecycle"]
        wake_patches = audited(kube.cluster.audit_log, "modelservices", name, "status", ACTIVATOR_USER)
        margins = wake.check_history(history)
        replicas = _replicas(history, name)
        report.append(
            f"wake, gRPC via {via}: {len(clients.calls) - woken_from} calls after the sleep ({CLIENTS} before), "
            f"{len(lost)} lost; asleep {asleep_at - idle_from:.1f} s after the warm calls; activator ports {ports}; "
            f"first held call complete ({GRPC_TOKENS} tokens) {first_done:.2f} s after the first was sent; "
            f"controller coldStartSeconds {lifecycle['coldStartSeconds']:.2f}; wake PATCHes by the activator "
            f"{wake_patches}; {margins}; replicas {replicas}; writes to the user's objects by the controller or "
            f"the activator: {len(written)}; {time.monotonic() - started:.0f} s"
        )
        wake.check_unchanged(now)
        assert not written, written
        assert not lost, lost[:5]
        assert len(held) == CLIENTS
        assert replicas == [REPLICAS, 0, REPLICAS], replicas
        assert 200 in wake_patches, "the wake was not asked for by the activator"
        if gateway is not None:
            assert gateway.reloads == 0, "the GRPCRoute's backend changed by a reload, not its endpoints"
    finally:
        if gateway is not None:
            await gateway.stop()
        if clients is not None:
            if clients._tasks and not clients._stopping:
                await clients.stop()
            await clients.close()
        await history.stop()
        helm.uninstall(release, NAMESPACE)
        await kube.wait_gone("Deployment", NAMESPACE, name, timeout=120)


ROUTER_PORT, ROUTER_ADMIN_PORT = 8080, 9091
"""The model chart's router ports (its defaults, as the scenarios install it)."""
CLIENT_PEER = {"podSelector": {"matchLabels": {"role": "client"}}}
OTHER_PEER = {"podSelector": {"matchLabels": {"role": "other-client"}}}


async def test_the_activator_admits_only_what_the_model_admits(kube: Kube, helm: Helm, report: list[str]) -> None:
    """A model release whose NetworkPolicy admits to its traffic port only ``role: client`` pods of
    its namespace (``networkPolicy.trafficFrom``) sleeps. Result: the NetworkPolicy the controller
    writes in the activator's namespace admits to the service's activator port that peer alone,
    translated (the model's namespace named): not every source, and not the controller's peer of the
    model's admin-port rule. 2. a person narrows the model's policy to another peer while it sleeps.
    Result: the activator's policy follows (the service still asleep)."""
    release = "kp"
    name = f"{release}-drain-router"
    chart_values = values(NAMESPACE, release, route=False)
    chart_values["networkPolicy"] = {"trafficFrom": [CLIENT_PEER]}
    helm.install(release, MODEL_CHART, NAMESPACE, chart_values)
    try:
        await kube.wait("phase ScaledToZero", lambda: _phase(kube, name, "ScaledToZero"), timeout=90)
        ports = await assigned_ports(kube, NAMESPACE, name)
        policy = await kube.get("NetworkPolicy", ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, name))
        assert policy is not None
        rules = policy["spec"]["ingress"]
        report.append(f"activator policy for a model admitting {CLIENT_PEER}: {rules}")
        translated = {**CLIENT_PEER, "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}}
        assert all("from" in rule for rule in rules), f"the activator's policy admits every source: {rules}"
        # What the model's own policy admits to its traffic port (the client peer and the activator's
        # own pods), from the activator's namespace; never its admin port's peer (the controller).
        installed = await kube.get("NetworkPolicy", NAMESPACE, name)
        assert installed is not None
        by_port = {p["port"]: rule.get("from", []) for rule in installed["spec"]["ingress"] for p in rule["ports"]}
        pinned = {"namespaceSelector": translated["namespaceSelector"]}
        expected = [peer if "namespaceSelector" in peer else {**peer, **pinned} for peer in by_port[ROUTER_PORT]]
        assert [rule["from"] for rule in rules] == [expected], rules
        assert translated in expected and not any(peer in expected for peer in by_port[ROUTER_ADMIN_PORT]), rules
        assert {p["port"] for rule in rules for p in rule["ports"]} == set(ports.values()), rules

        # A person narrows the model's policy while it sleeps: the activator's follows.
        model_policy = await kube.get("NetworkPolicy", NAMESPACE, name)
        assert model_policy is not None
        narrowed = [
            {**rule, "from": [OTHER_PEER]} if CLIENT_PEER in rule.get("from", []) else rule
            for rule in model_policy["spec"]["ingress"]
        ]
        await kube.patch("NetworkPolicy", NAMESPACE, name, {"spec": {"ingress": narrowed}})
        moved = {**OTHER_PEER, "namespaceSelector": translated["namespaceSelector"]}

        async def followed() -> bool:
            found = await kube.get("NetworkPolicy", ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, name))
            return found is not None and [r.get("from") for r in found["spec"]["ingress"]] == [[moved]]

        await kube.wait("the activator's policy to follow the model's", followed, timeout=60)
        msvc = await kube.get("ModelService", NAMESPACE, name)
        assert msvc is not None and msvc["status"]["lifecycle"]["phase"] == "ScaledToZero"
    finally:
        helm.uninstall(release, NAMESPACE)
        await kube.wait_gone("Deployment", NAMESPACE, name, timeout=120)
