"""Scale to zero and wake on a request, on the real control plane, through a gateway fed from the
real HTTPRoutes, Services, EndpointSlices and ReferenceGrants.

The model chart renders a ModelService with a ScaleToZero rule after a few idle seconds; the
controller chart runs the controller with ``--activator-service`` and the activator (two replicas),
with ReferenceGrants admitting routes from team-a and team-b. One stream per client through the
gateway makes the routers have served; once they have been idle long enough the controller points
the route at the activator, then scales the Deployment to 0, and the real Deployment, ReplicaSet and
EndpointSlice controllers remove the pods and empty the model Service's EndpointSlices. The same
OpenAI SDK streaming clients then send again through the gateway: the activator holds their
requests and writes ``wakeRequestedAt`` to the ModelService's status, the controller scales the
Deployment back, the activator forwards the held requests to the first router that answers ready,
and the controller points the route back at the model Service. The clients keep streaming back to
back until each has completed two streams sent after the gateway applied the route's return.

What is asserted comes from the API server: a watch on the route, the EndpointSlices, the
Deployment and the ModelService, replayed in resourceVersion order (:mod:`e2e.kubernetes.history`),
so each write is seen with every other object as the API server held it then; and its audit log
for who wrote the wake. No stream is lost (each ends with a ``finish_reason``); the cold start is
measured as the clients saw it (first request sent to the activator -> its first byte) beside the
controller's ``coldStartSeconds`` and the activator's ``activation_seconds``.

Every assertion about the user's route (where it points asleep and awake, and its invariants with
the EndpointSlices) is in :class:`Routing`: a wake that leaves the route alone changes that class
only.

The gateway reloads HAProxy on each route change (the backends' request headers change with it).
A reloaded HAProxy's old worker answers one more request on each kept-alive client connection with
its old routes, then closes it. At the wake's return that request goes to the activator, which is
forwarding by then and relays it to a router: nothing is lost, and the scenario keeps the clients'
connections alive across that reload to show it (the report counts those requests). At the sleep
the clients are quiet and their connections idle; the old worker closes idle connections when it
stops (HAProxy 2.6's default), so the SDK's pools open new ones, to the new worker, when the same
clients come back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drain_router.decisions import durations
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.history import History
from e2e.kubernetes.kube import MODEL_CHART, Helm, Json, Kube, is_ready
from e2e.real_engine import Outcome, Record, request_body

NAMESPACE = "team-a"
REPLICAS = 2
IDLE_SECS = 3
"""The ScaleToZero rule's idle time: longer than any gap between two of a client's streams."""
CLIENTS = 6
MAX_TOKENS = models.CHUNKS
AFTER_RETURN = 2
"""Streams each client completes, sent after the gateway applied the route's return."""
ACTIVATOR_NAMESPACE = "drain-router-system"
ACTIVATOR = "ctl-drain-router-controller-activator"
ACTIVATOR_PORT = 8080
ACTIVATOR_ADMIN_PORT = 9091
WATCHED = ("HTTPRoute", "EndpointSlice", "Deployment", "ModelService")
pytestmark = pytest.mark.timeout(600, func_only=True)


def values(namespace: str, release: str) -> dict[str, Any]:
    """The fake model chart's values with the ModelService: ScaleToZero after :data:`IDLE_SECS`, and
    a teardown without a settle (the scenario's uninstall)."""
    return models.fake_model_values(
        namespace,
        release,
        replicas=REPLICAS,
        model_service=True,
        extra={
            "modelService": {
                "enabled": True,
                "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": IDLE_SECS}}],
                "activationTimeoutSeconds": 120,
                "deletion": {"routeSettle": "0s", "maxWait": "5m"},
            }
        },
    )


def ready_addresses(slices: list[Json], service: str) -> set[str]:
    """The ready endpoints' addresses of ``service``'s EndpointSlices."""
    return {
        address
        for item in slices
        if item["metadata"].get("labels", {}).get("kubernetes.io/service-name") == service
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready")
        for address in endpoint.get("addresses", [])
    }


def any_endpoint(slices: list[Json], service: str) -> bool:
    return any(
        item.get("endpoints")
        for item in slices
        if item["metadata"].get("labels", {}).get("kubernetes.io/service-name") == service
    )


@dataclasses.dataclass(frozen=True)
class Routing:
    """Everything the scenario says about the user's route. Today a sleep points every rule at the
    activator's Service with a header naming the ModelService (the originals saved in an
    annotation), and the wake gives the rules back exactly."""

    namespace: str
    service: str
    """The ModelService's name: the header's ``<namespace>/<name>``."""
    model_service: str
    """The model Service's name (the route's backend while awake)."""
    original: Json
    """The route as the chart installed it."""

    def at_activator(self, route: Json) -> bool:
        return all(
            [(r.get("namespace"), r["name"], r.get("port")) for r in rule.get("backendRefs") or []]
            == [(ACTIVATOR_NAMESPACE, ACTIVATOR, ACTIVATOR_PORT)]
            for rule in route["spec"]["rules"]
        )

    def at_service(self, route: Json) -> bool:
        return bool(route["spec"] == self.original["spec"])

    def check_asleep(self, route: Json) -> None:
        """Every rule at the activator alone, as the API server holds it: the ref the controller
        wrote with the schema's default ``weight``; the header set; the originals (with the
        schema's defaults the API server gave them at install) saved; the rest of the route kept."""
        at_activator = {
            "group": "", "kind": "Service", "name": ACTIVATOR, "namespace": ACTIVATOR_NAMESPACE,
            "port": ACTIVATOR_PORT, "weight": 1,
        }  # fmt: skip
        assert all(rule["backendRefs"] == [at_activator] for rule in route["spec"]["rules"]), route["spec"]
        header = {"name": "x-drain-router-service", "value": f"{self.namespace}/{self.service}"}
        for rule in route["spec"]["rules"]:
            (modifier,) = [f for f in rule.get("filters") or [] if f["type"] == "RequestHeaderModifier"]
            assert header in modifier["requestHeaderModifier"]["set"], rule
        saved = json.loads(route["metadata"]["annotations"]["drainrouter.dev/backend-refs"])
        assert saved == [
            {k: rule[k] for k in ("backendRefs", "filters") if k in rule} for rule in self.original["spec"]["rules"]
        ]
        assert [r.get("matches") for r in route["spec"]["rules"]] == [
            r.get("matches") for r in self.original["spec"]["rules"]
        ]
        assert {k: v for k, v in route["spec"].items() if k != "rules"} == {
            k: v for k, v in self.original["spec"].items() if k != "rules"
        }

    def check_awake(self, route: Json) -> None:
        assert self.at_service(route), (route["spec"], self.original["spec"])
        assert "drainrouter.dev/backend-refs" not in (route["metadata"].get("annotations") or {})

    def gateway_asleep(self, gateway: Gateway, host: str, activators: set[str]) -> bool:
        """The gateway sends the host to the activator's pods, and only there."""
        served = {address for address, _ in gateway.servers(host)}
        return bool(served) and served == activators

    def check_history(self, history: History, route_name: str) -> str:
        """The route's versions go to the activator and back once; at no write did the API server hold
        the route at the model Service while that Service had no ready endpoint, nor the Deployment at
        0 replicas while the route pointed at the model Service. For the report: the route's path and
        its margins (from the route's switch to the scale to 0, from the first ready endpoint after
        the wake to the route's return), as the watches delivered them."""
        where: list[str] = []
        for route in history.versions("HTTPRoute", route_name):
            place = "service" if self.at_service(route) else "activator" if self.at_activator(route) else "other"
            if not where or where[-1] != place:
                where.append(place)
        assert where == ["service", "activator", "service"], where
        moments: dict[str, float] = {}
        for change, held in history.states():
            route = held.get(("HTTPRoute", route_name))
            slices = [obj for (kind, _), obj in held.items() if kind == "EndpointSlice"]
            deployment = held.get(("Deployment", self.model_service))
            ready = bool(ready_addresses(slices, self.model_service))
            if route is not None and self.at_activator(route):
                moments.setdefault("to activator", change.seen)
            if deployment is not None and deployment["spec"]["replicas"] == 0:
                moments.setdefault("scaled to 0", change.seen)
            if "scaled to 0" in moments and not ready:
                moments.setdefault("no endpoint", change.seen)
            if "no endpoint" in moments and ready:
                moments.setdefault("ready again", change.seen)
            if "ready again" in moments and route is not None and self.at_service(route):
                moments.setdefault("route back", change.seen)
            if route is None or not self.at_service(route):
                continue
            assert ready, (
                f"at version {change.version} ({change.kind}/{change.name}) the route pointed at "
                f"{self.model_service} with no ready endpoint"
            )
            assert deployment is None or deployment["spec"]["replicas"] > 0, (
                f"at version {change.version} the Deployment was at 0 with the route at the Service"
            )
        return (
            f"route {' -> '.join(where)}, scaled to 0 {moments['scaled to 0'] - moments['to activator']:.2f} s "
            f"after the route's switch, route back {moments['route back'] - moments['ready again']:.2f} s after "
            "the first ready endpoint"
        )


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
    """``count`` OpenAI SDK clients through the gateway, no retries, each with its own connection
    pool, kept for the whole scenario as an application keeps its client: one stream each
    (:meth:`once`), quiet while the service sleeps, then back to back from :meth:`start` to
    :meth:`stop`."""

    base_url: str
    host: str
    count: int
    streams: list[Timed] = dataclasses.field(default_factory=list)
    _clients: list[Any] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        import openai

        headers = {"Host": self.host}
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


def after_last_reload(workdir: Path, addresses: set[str]) -> int:
    """Requests the gateway's HAProxy accepted after its last reload and sent to one of
    ``addresses``: the new worker has no such server once the route went back, so each is one an old
    worker answered with its old routes on a kept-alive connection. From the gateway's files: the
    reload's time in ``applied.log``, each request's accept time (``%tr``, local time) in
    ``haproxy.log``."""
    reloads = [
        float(line.split()[0]) for line in (workdir / "applied.log").read_text().splitlines() if " reload " in line
    ]
    count = 0
    for line in (workdir / "haproxy.log").read_text().splitlines():
        match = re.match(r"\d+ \S+ \[([^]]+)\] \S+\(([\d.]+):\d+\)", line)
        if match is None:
            continue
        accepted = datetime.datetime.strptime(match[1], "%d/%b/%Y:%H:%M:%S.%f").timestamp()
        count += accepted >= reloads[-1] and match[2] in addresses
    return count


async def _async(value: Any) -> Any:
    return value


@pytest.mark.parametrize("delay", [0.0, 2.0], ids=["gateway-0s", "gateway-2s"])
async def test_a_request_wakes_a_service_scaled_to_zero(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, delay: float, report: list[str]
) -> None:
    """1. two pods serve one stream, then idle. Result: the route at the activator, then the
    Deployment at 0, its pods gone, the model Service's EndpointSlices empty, phase ScaledToZero,
    and the gateway sending the host to the activator (the ReferenceGrant admits the route).
    2. six SDK clients stream back to back through the gateway. Result: the activator holds the first
    requests and asks for a wake (its own PATCH of the status subresource), the Deployment back at 2,
    the route back exactly as installed once the EndpointSlices have ready endpoints, phase Active;
    every stream, held or not, ends with a finish_reason, two per client sent after the gateway
    applied the route's return among them."""
    release = f"kd{int(delay)}"
    name = f"{release}-drain-router"  # the Deployment, Service, HTTPRoute and ModelService alike
    host = models.hostname(NAMESPACE, release)
    activator_user = f"system:serviceaccount:{ACTIVATOR_NAMESPACE}:{ACTIVATOR}"
    assert await kube.get("Service", ACTIVATOR_NAMESPACE, ACTIVATOR) is not None, "the activator's Service"
    helm.install(release, MODEL_CHART, NAMESPACE, values(NAMESPACE, release))
    started = time.monotonic()
    history = History(kube.api, NAMESPACE, WATCHED)
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=delay)
    clients: Clients | None = None
    try:
        await history.start()
        await gateway.start()
        route = await kube.get("HTTPRoute", NAMESPACE, name)
        assert route is not None
        routing = Routing(NAMESPACE, name, name, route)
        await kube.wait("the gateway serving both pods", lambda: _async(len(gateway.servers(host)) == REPLICAS))

        # 1. One stream per client, so the routers have served; then quiet until asleep.
        clients = Clients(gateway.url, host, CLIENTS)
        warm = await clients.once()
        assert all(s.record.outcome is Outcome.COMPLETED for s in warm), warm
        idle_from = time.monotonic()
        msvc = await kube.wait("phase ScaledToZero", lambda: _phase(kube, name, "ScaledToZero"), timeout=90)
        asleep_at = time.monotonic()
        assert msvc["status"]["lifecycle"]["replicasBeforeZero"] == REPLICAS
        await kube.wait("the Deployment at 0, its pods gone", lambda: _scaled(kube, name, 0, release), timeout=90)
        await kube.wait("the model Service's EndpointSlices empty", lambda: _no_endpoints(kube, name), timeout=90)
        route = await kube.get("HTTPRoute", NAMESPACE, name)
        assert route is not None
        routing.check_asleep(route)
        activators = await kube.wait("the activator's endpoints", lambda: _ready(kube, ACTIVATOR_NAMESPACE, ACTIVATOR))
        await kube.wait(
            "the gateway sending the host to the activator",
            lambda: _async(routing.gateway_asleep(gateway, host, activators)),
        )
        before = await activator_metrics(activators)

        # 2. The same clients stream again: through the gateway to the activator, which wakes it.
        woken_from = len(clients.streams)
        clients.start()
        msvc = await kube.wait("phase Active", lambda: _phase(kube, name, "Active"), timeout=150)
        await kube.wait("the Deployment back at 2", lambda: _scaled(kube, name, REPLICAS, release), timeout=90)
        pods = await kube.wait(
            "the model Service's EndpointSlices ready", lambda: _ready(kube, NAMESPACE, name, REPLICAS), timeout=90
        )
        route = await kube.get("HTTPRoute", NAMESPACE, name)
        assert route is not None
        routing.check_awake(route)
        await kube.wait(
            "the gateway sending the host to the model pods",
            lambda: _async({a for a, _ in gateway.servers(host)} == pods),
            timeout=30,
        )
        returned = time.monotonic()
        await kube.wait(
            f"{AFTER_RETURN} streams per client after the route's return",
            lambda: _async(clients.completed_after(returned)),
            timeout=120,
        )
        await history.stop()  # before the load stops: the next sleep is not this scenario's
        await clients.stop()
        after = await activator_metrics(activators)

        lost = [s for s in clients.streams if s.record.outcome is not Outcome.COMPLETED]
        first = [s for s in clients.streams if s.index == 1]  # held: each client's first after the warm one
        cold = min(s.first_byte or float("inf") for s in first) - min(s.sent for s in first)
        last = max(s.first_byte or float("inf") for s in first) - min(s.sent for s in first)
        lifecycle = msvc["status"]["lifecycle"]
        asked = durations.parse_time(lifecycle["wakeRequestedAt"])
        awoken = durations.parse_time(lifecycle["awokenAt"])
        wake_patches = audited(kube.cluster.audit_log, "modelservices", name, "status", activator_user)
        path = routing.check_history(history, name)
        replicas = _replicas(history, name)
        old_routes = after_last_reload(tmp_path, activators)
        held = after["activation_seconds_sum"] - before["activation_seconds_sum"]
        activations = after["activations"] - before["activations"]
        report.append(
            f"wake, gateway {delay:.0f} s late: {len(clients.streams) - woken_from} streams after the sleep "
            f"({CLIENTS} before), {len(lost)} lost; asleep "
            f"{asleep_at - idle_from:.1f} s after the warm stream; cold start (first request sent -> first "
            f"byte) {cold:.2f} s, all {CLIENTS} held answered by {last:.2f} s; controller coldStartSeconds "
            f"{lifecycle['coldStartSeconds']:.2f}; activator activation_seconds {held:.2f} over "
            f"{activations:.0f} activations; wake PATCHes by the activator {wake_patches}; {path}; "
            f"replicas {replicas}; gateway reloads {gateway.reloads}, {old_routes} requests to the activator "
            f"after the last one (an old worker's one more per kept-alive connection); {time.monotonic() - started:.0f} s"
        )
        assert not lost, lost[:5]
        assert {s.record.detail for s in clients.streams} <= {"length", "stop"}  # each its finish_reason
        assert len(first) == CLIENTS and all(s.first_byte is not None for s in first)
        assert replicas == [REPLICAS, 0, REPLICAS], replicas
        assert lifecycle["coldStartSeconds"] > 0 and awoken > asked
        assert 200 in wake_patches, "the wake was not asked for by the activator"
        assert 1 <= activations <= len(activators) and after["held"] == 0, (before, after)
    finally:
        if clients is not None:
            if clients._tasks and not clients._stopping:
                await clients.stop()
            await clients.close()
        await history.stop()
        await gateway.stop()
        helm.uninstall(release, NAMESPACE)
        await kube.wait_gone("Deployment", NAMESPACE, name, timeout=120)


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


async def _no_endpoints(kube: Kube, service: str) -> bool:
    return not any_endpoint(await kube.list("EndpointSlice", NAMESPACE), service)


async def _ready(kube: Kube, namespace: str, service: str, count: int = 1) -> set[str] | None:
    """The ready addresses of ``service``, once there are at least ``count``."""
    found = ready_addresses(await kube.list("EndpointSlice", namespace), service)
    return found if len(found) >= count else None


def _replicas(history: History, name: str) -> list[int]:
    """The Deployment's successive ``spec.replicas``, repeats folded."""
    seen: list[int] = []
    for deployment in history.versions("Deployment", name):
        if not seen or seen[-1] != deployment["spec"]["replicas"]:
            seen.append(deployment["spec"]["replicas"])
    return seen
