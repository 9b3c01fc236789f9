"""The activator's gRPC (h2c) calls: the same services, held queues and wakes as its HTTP requests
(:mod:`.sites`), forwarded through a pool of h2c connections to the pod's router's gRPC port
(``http://<podIP>:<spec.router.grpcPort>``) instead of its traffic port.

A call's service is read once, when its request HEADERS are complete (:meth:`GrpcSites.pick`), from
its ``x-drain-router-service`` metadata. Answered at once, trailers-only, never held: a call naming
no service or an invalid one (UNIMPLEMENTED), a service that does not exist (NOT_FOUND), one more
service than ``--max-services`` (UNAVAILABLE), a service whose ModelService has no ``grpcPort``
(UNAVAILABLE, held calls too once it is read), and health calls (UNIMPLEMENTED: the activator is
not the service; a health check must not wake it). Any other call waits in its service's gate
beside the HTTP requests (one bound, one first-in first-out order, counted in
``activator_held_requests``): a full queue answers RESOURCE_EXHAUSTED, the activation timeout and
closing UNAVAILABLE, each with ``grpc-retry-pushback-ms`` (the last cold start; at closing, at once
elsewhere); a client's RST_STREAM frees its place at once.
"""

from __future__ import annotations

import asyncio
from typing import Final

from drain_router import config
from drain_router.activator.sites import ServiceSite, Sites
from drain_router.admission.gate import Gate
from drain_router.decisions.capacity import Answer, Reason
from drain_router.decisions.grpc_status import GrpcStatus
from drain_router.grpc import health
from drain_router.grpc.call import Call
from drain_router.grpc.listener import GrpcListener
from drain_router.grpc.pool import GrpcPool
from drain_router.h2.connection import Connection
from drain_router.h2.rules import Request
from drain_router.h2.streams import Headers, Stream
from drain_router.metrics import Metrics
from drain_router.state import InFlight

#: A held call's refusals (the router's own say "admission queue"; here the service is waking).
ANSWERS: Final = {
    Reason.QUEUE_FULL: (GrpcStatus.RESOURCE_EXHAUSTED, "too many calls are held for this service while it wakes"),
    Reason.QUEUE_TIMEOUT: (GrpcStatus.UNAVAILABLE, "the service did not wake within the activation timeout"),
    Reason.CLOSING: (GrpcStatus.UNAVAILABLE, "the activator is shutting down; retry on another replica"),
}
#: The answers to a call refused before it is held, by the HTTP refusal's code (:mod:`.sites`).
REFUSALS: Final = {
    "no_service": (GrpcStatus.UNIMPLEMENTED, "the call names no service (x-drain-router-service)"),
    "bad_service": (GrpcStatus.UNIMPLEMENTED, "x-drain-router-service must be <namespace>/<name>"),
    "service_not_found": (GrpcStatus.NOT_FOUND, "no such service"),
    "activator_full": (GrpcStatus.UNAVAILABLE, "the activator holds calls for too many services"),
}
NO_GRPC_PORT: Final = (
    GrpcStatus.UNAVAILABLE,
    "the service has no gRPC port (its ModelService sets no spec.router.grpcPort)",
)
HEALTH: Final = (GrpcStatus.UNIMPLEMENTED, "the activator answers no health checks for a service")


class GrpcSite:
    """One service's destination for gRPC calls (a :class:`~drain_router.grpc.call.Site`): the
    service's gate, and while it forwards, the pool to its pod's router's gRPC port."""

    __slots__ = (
        "access_log",
        "flusher",
        "gate",
        "inflight",
        "listener",
        "loop",
        "metrics",
        "pool",
        "pools",
        "site",
        "watches",
    )

    answers = ANSWERS

    def __init__(self, site: ServiceSite, listener: GrpcListener) -> None:
        self.site, self.listener = site, listener
        self.metrics: Metrics = listener.metrics
        self.flusher = listener.flusher
        self.loop: asyncio.AbstractEventLoop = listener.loop
        self.inflight: InFlight = listener.inflight
        self.access_log = listener.access_log
        self.watches: set[Call] = listener.watches
        self.gate: Gate | None = site.gate
        self.pool: GrpcPool | None = None
        self.pools: dict[str, GrpcPool] = {}
        """By URL: the one it forwards to, and earlier ones while calls run on them."""
        self.sync()

    def sync(self) -> None:
        """Follow the site: a pool to its pod's router's gRPC port while it forwards (set before its
        gate opens: the held calls start on it), none while it holds; a pool no longer forwarded to
        is closed once idle (here, at the next change, or at exit)."""
        site = self.site
        url = site.url
        if url is None or site.grpc_port is None:
            self.pool = None
        else:
            url = f"{url.rsplit(':', 1)[0]}:{site.grpc_port}"
            pool = self.pools.get(url)
            if pool is None:
                listener = self.listener
                upstream = config.parse_upstream(url)
                pool = self.pools[url] = GrpcPool(
                    upstream, listener.connect_timeout, listener.upstream_limit, self.flusher
                )
            self.pool = pool
        for old in [u for u, p in self.pools.items() if p is not self.pool and _idle(p)]:
            self.pools.pop(old).close()

    def refuse_held(self, answer: tuple[GrpcStatus, str]) -> int:
        """Answer every held gRPC call now (its HTTP requests go on waiting): they leave the gate."""
        words = Answer(http=None, grpc=answer)
        return sum(waiter.answer(words) for waiter in list(self.site.gate.waiters))

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


def _idle(pool: GrpcPool) -> bool:
    return not pool.waiters and not any(conn.core.streams for conn in pool.conns)


def port_read(site: ServiceSite, port: int | None) -> None:
    """The watcher read the ModelService's ``spec.router.grpcPort``: none, and the gRPC calls held
    for it are answered UNAVAILABLE now (and new ones at once, :meth:`GrpcSites.pick`)."""
    site.grpc_port, site.grpc_port_read = port, True
    if port is None and site.grpc is not None:
        site.table.own.refused.labels("no_grpc_port").inc(site.grpc.refuse_held(NO_GRPC_PORT))


class GrpcSites:
    """The gRPC listener's destinations (its :class:`~drain_router.grpc.inbound.Sites`): the
    table of services of :class:`~.sites.Sites`, each with its :class:`GrpcSite`."""

    def __init__(self, sites: Sites) -> None:
        self.sites = sites
        self.listener: GrpcListener | None = None
        """Set once made (it is made with this)."""

    def pick(self, conn: Connection, stream: Stream, headers: Headers, request: Request, end: bool) -> GrpcSite | None:
        listener = self.listener
        assert listener is not None
        answer = HEALTH if request.path in health.PATHS else None
        if answer is None:
            dest = self.sites.pick(headers)
            if not isinstance(dest, ServiceSite):
                answer = REFUSALS[dest.refusal[1]]
            elif dest.grpc_port is None and (dest.grpc_port_read or dest.forwarding):
                self.sites.own.refused.labels("no_grpc_port").inc()
                answer = NO_GRPC_PORT
            else:
                if dest.grpc is None:
                    dest.grpc = GrpcSite(dest, listener)
                return dest.grpc  # type: ignore[no-any-return]
        Call(listener, conn, stream, headers, request, end, counted=False).reject(*answer)
        return None
