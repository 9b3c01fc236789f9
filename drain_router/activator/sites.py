"""One destination per ModelService (:class:`ServiceSite`), and the table of them (:class:`Sites`).

A site is what every listener of its service's ports hands a request to: the port a connection
arrived on chose it, and it is the picker of those listeners (:meth:`ServiceSite.pick`, the
:class:`~drain_router.http1.reader.Sites` of an HTTP port), so nothing a client sends (a header,
a name, a ``Host``) can reach another service's queue or pod. A site is a held queue: a
:class:`~drain_router.admission.gate.Gate` of 0 slots (bound ``--queue-size``, timeout
``--activation-timeout-secs``, every refusal's ``Retry-After`` from the last cold start) and no
upstream pool while no pod of its service is ready. Once one is (:meth:`ServiceSite.forward`), it
gets a pool to that pod's router and its gate opens: the held requests go in arrival order, and new
ones go straight through. Asleep again (:meth:`ServiceSite.hold`), the gate closes to 0; what is in
flight finishes on its connections.

A service found not to exist (404) or not to be the activator's to read (403) has its held requests
answered at once and new ones refused for a poll interval (:meth:`ServiceSite.refuse`): 404
``service_not_found``, 503 ``service_unavailable``, in the activator's own words, naming nothing.
A site whose every port left the port map is retired (:meth:`Sites.retire`): its held requests are
answered 503 with ``Connection: close`` (their retry finds the service's endpoints of now), what it
forwards finishes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from drain_router import config, logs
from drain_router.activator.settings import ActivatorSettings
from drain_router.admission.gate import Gate
from drain_router.decisions import activation
from drain_router.decisions.capacity import Answer, Reason
from drain_router.decisions.grpc_status import GrpcStatus
from drain_router.http1 import answers
from drain_router.http1.exchange import Exchange
from drain_router.http1.heads import Headers
from drain_router.http1.traced import TracedExchange
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.metrics import ActivatorMetrics, Metrics

log = logs.get("drain_router.activator")

#: Opened wide once a pod is ready: every held request goes at once, oldest first (the pod's own
#: router does the admission control).
OPEN_SLOTS = 1 << 30

#: Connections opened to a pod ahead of the held requests (:meth:`ServiceSite.warm`); past these,
#: requests still leave in arrival order, but each connects on its own.
WARM_CONNECTIONS = 256

NOT_FOUND: answers.Error = (404, "service_not_found", "no such service")
UNAVAILABLE: answers.Error = (503, "service_unavailable", "this service cannot be woken through the activator")
GRPC_NOT_FOUND = (GrpcStatus.NOT_FOUND, "no such service")
GRPC_UNAVAILABLE = (GrpcStatus.UNAVAILABLE, "this service cannot be woken through the activator")
#: A held request's answer, whichever protocol it speaks, when its ModelService turns out not to
#: exist (404), or reading it is forbidden to the activator (403).
NOT_FOUND_ANSWER = Answer(http=NOT_FOUND, grpc=GRPC_NOT_FOUND)
UNAVAILABLE_ANSWER = Answer(http=UNAVAILABLE, grpc=GRPC_UNAVAILABLE)


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A destination that is only a refusal (the exchange never takes a slot or a connection)."""

    refusal: answers.Error
    reason: str
    gate: None = None
    pool: None = None
    host_header: bytes = b""
    exchange_type = Exchange
    traced_exchange_type = TracedExchange


class _Rejections:
    """The router's ``admission_rejections`` by reason, and ``activation_timeouts`` for a timeout."""

    __slots__ = ("metrics",)

    def __init__(self, metrics: tuple[Metrics, ActivatorMetrics]) -> None:
        self.metrics = metrics

    def labels(self, reason: str) -> Any:
        router, own = self.metrics
        counter = router.admission_rejections.labels(reason)
        return _Both(counter, own.activation_timeouts) if reason == Reason.QUEUE_TIMEOUT.value else counter


class _Both:
    __slots__ = ("counters",)

    def __init__(self, *counters: Any) -> None:
        self.counters = counters

    def inc(self) -> None:
        for counter in self.counters:
            counter.inc()


class _GateMetrics:
    """A site's gate's series (:class:`~drain_router.admission.gate.GateMetrics`)."""

    __slots__ = ("admission_rejections", "queue_depth", "queue_wait")

    def __init__(self, service: str, router: Metrics, own: ActivatorMetrics) -> None:
        self.queue_depth = own.held.labels(service)
        self.queue_wait = router.queue_wait
        self.admission_rejections = _Rejections((router, own))


class ServiceSite:
    """One ModelService's held queue and, while a pod of it is ready, its pool; the picker of the
    listeners of its ports."""

    refusal = None
    exchange_type = Exchange
    traced_exchange_type = TracedExchange

    def __init__(self, namespace: str, name: str, table: Sites) -> None:
        self.namespace, self.name = namespace, name
        self.service = f"{namespace}/{name}"
        self.table = table
        self.host_header = f"{name}.{namespace}".encode()
        """``Host`` for an HTTP/1.0 request that came without one: the service's name."""
        settings = table.settings
        self.gate = Gate(
            0,
            settings.queue_size,
            float(settings.activation_timeout_secs),
            metrics=_GateMetrics(self.service, table.metrics, table.own),
        )
        self.gate.retry_after = float(activation.retry_after(None))
        self.pool: UpstreamPool | None = None
        self.url: str | None = None
        """The pod's router it forwards to (None: it holds)."""
        self.pools: dict[str, UpstreamPool] = {}
        """Its pools by URL: the one it forwards to, and earlier ones while they have connections (a
        pod's requests still in flight finish on them); closed at exit."""
        self.held_since: float | None = None
        """Loop time of the first request held since it last forwarded (``activation_seconds``)."""
        self.refused: Refused | None = None
        self.refused_until = 0.0
        """Loop time until which every request is answered :attr:`refused` at once (its ModelService
        was not found, or may not be read)."""
        self.demand = asyncio.Event()
        """Set by a request it takes: its watcher (:mod:`.waking`) polls while set."""
        self.ports: set[int] = set()
        """The ports listening for it (none: it is retired)."""
        self.watcher: asyncio.Task[None] | None = None
        self.grpc: Any = None
        """Its gRPC side (:class:`~.grpcsites.GrpcSite`), once a gRPC call came for it."""
        self.grpc_port: int | None = None
        self.grpc_port_read = False  # spec.router.grpcPort (None: none), once read

    def pick(self, headers: Headers) -> ServiceSite | Refused:
        """The destination of a request that arrived on one of its ports: itself (held or
        forwarded), or its refusal while one stands. The headers are not looked at."""
        now = self.table.loop.time()
        if self.refused is not None and self.refused_until > now:
            self.table.own.refused.labels(self.refused.reason).inc()
            return self.refused
        if not self.forwarding and self.held_since is None:
            self.held_since = now
        self.demand.set()
        return self

    @property
    def forwarding(self) -> bool:
        return self.url is not None

    def set_cold_start(self, seconds: float | None) -> None:
        """The last cold start read from the service's status: the ``Retry-After`` of its refusals."""
        self.gate.retry_after = float(activation.retry_after(seconds))

    def _pool(self, url: str) -> UpstreamPool:
        pool = self.pools.get(url)
        if pool is None:
            for old in [u for u, p in self.pools.items() if not p.open and u != self.url]:
                self.pools.pop(old).close()  # a pod of an earlier wake with no connection left
            pool = self.pools[url] = self.table.make_pool(url)
        return pool

    async def warm(self, url: str) -> int:
        """Open a connection to the pod's router at ``url`` for each request held (at most
        :data:`WARM_CONNECTIONS`), before :meth:`forward`: their heads are then written in arrival
        order in one turn of the loop, none overtaking another while connecting."""
        return await self._pool(url).warm(min(len(self.gate), WARM_CONNECTIONS))

    def forward(self, url: str, now: float) -> None:
        """A pod's router at ``url`` answered ready: held requests go to it in arrival order."""
        if self.url == url:
            return
        self.pool, self.url = self._pool(url), url
        if self.grpc is not None:
            self.grpc.sync()  # (before the gate opens: its held calls start on the new pool)
        if self.held_since is not None:
            self.table.own.activations.inc()
            self.table.own.activation_seconds.observe(now - self.held_since)
            self.held_since = None
        log.info("activator.forwarding", service=self.service, held=len(self.gate), upstream=url)
        self.gate.resize(OPEN_SLOTS)

    def hold(self) -> None:
        """No ready pod any more: new requests are held again (what is in flight goes on)."""
        if self.url is None:
            return
        log.info("activator.holding", service=self.service, upstream=self.url, inflight=self.gate.active)
        self.url = None
        self.gate.resize(0)
        if self.grpc is not None:
            self.grpc.sync()

    def refuse(self, refused: Refused, answer: Answer, now: float, for_secs: float) -> None:
        """Its ModelService does not exist, or may not be read: every held request is answered
        ``answer`` now, and new ones ``refused`` for ``for_secs``."""
        self.refused, self.refused_until = refused, now + for_secs
        self.held_since = None
        for waiter in self.gate.take_waiters():
            self.table.own.refused.labels(refused.reason).inc()
            waiter.answer(answer)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        if self.grpc is not None:
            self.grpc.close()


class Sites:
    """The services with a port, by ``(namespace, name)``; each one's watcher started with it."""

    def __init__(
        self,
        settings: ActivatorSettings,
        cfg: config.Config,
        metrics: Metrics,
        own: ActivatorMetrics,
        *,
        watch: Callable[[ServiceSite], asyncio.Task[None]],
        note_connect: Callable[[bool], None],
    ) -> None:
        self.settings = settings
        self.config = cfg
        self.metrics, self.own = metrics, own
        self.watch = watch
        """Starts a site's watcher (:mod:`.waking`), for as long as the site has a port."""
        self.note_connect = note_connect
        self.sites: dict[tuple[str, str], ServiceSite] = {}
        self.retired: list[ServiceSite] = []
        """Sites with no port left whose forwarded requests may still run: their pools are closed once
        idle (:meth:`sweep`), or at exit."""
        self.loop = asyncio.get_running_loop()
        self.leaving = False
        self.not_found = Refused(NOT_FOUND, "not_found")
        self.unavailable = Refused(UNAVAILABLE, "forbidden")

    def __len__(self) -> int:
        return len(self.sites)

    def held(self) -> int:
        """Requests held now, every service's (``/admin/inflight``'s ``queued``)."""
        return sum(len(site.gate) for site in self.sites.values())

    def make_pool(self, url: str) -> UpstreamPool:
        upstream = config.parse_upstream(url)
        cfg = dataclasses.replace(self.config, proxy=dataclasses.replace(self.config.proxy, upstream=upstream))
        return UpstreamPool(cfg, self.note_connect)

    def site(self, namespace: str, name: str) -> ServiceSite:
        """The site of a service a port is opened for (made, and its watcher started, if new)."""
        site = self.sites.get((namespace, name))
        if site is None:
            site = self.sites[(namespace, name)] = ServiceSite(namespace, name, self)
            if self.leaving:
                site.gate.close()
            site.watcher = self.watch(site)
        return site

    def retire(self, site: ServiceSite) -> None:
        """``site`` has no port left: its watcher stops, its held requests are answered 503 with
        ``Connection: close`` (the gate's closing answer: a retry goes to the service's endpoints of
        now), and its series go; what it forwards finishes (:meth:`sweep`)."""
        if self.sites.get((site.namespace, site.name)) is not site:
            return
        del self.sites[(site.namespace, site.name)]
        if site.watcher is not None:
            site.watcher.cancel()
        site.gate.close()
        self.own.held.remove(site.service)
        self.retired.append(site)
        self.sweep()

    def sweep(self) -> None:
        """Close the pools of retired sites with nothing in flight any more."""
        for site in [s for s in self.retired if not s.gate.active]:
            self.retired.remove(site)
            site.close()

    def close_queues(self) -> None:
        """Closing: every held request is answered 503 with ``Connection: close`` (the gates'), and
        so is every new one."""
        self.leaving = True
        for site in self.sites.values():
            site.gate.close()

    def set_leaving(self, leaving: bool) -> None:
        for site in self.sites.values():
            site.gate.leaving = leaving

    def close(self) -> None:
        for site in [*self.sites.values(), *self.retired]:
            site.close()
