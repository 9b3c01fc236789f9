"""The activator's gRPC (h2c) calls: the same services, held queues and wakes as its HTTP requests
(:mod:`.sites`), forwarded through a pool of h2c connections to the pod's router's gRPC port
(``http://<podIP>:<spec.router.grpcPort>``) instead of its traffic port.

A call's service is its port's (:class:`GrpcPortSites`, the picker of a ``grpc`` port's listener),
never its metadata. Answered at once, trailers-only, never held: a service refused by its watcher
(not found: NOT_FOUND; not the activator's to read: UNAVAILABLE), a service whose ModelService has
no ``grpcPort`` (UNAVAILABLE: the calls held are answered as soon as the ModelService is read,
before any wake is asked for, :func:`port_read`), and health calls (UNIMPLEMENTED: the activator is
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
from drain_router.activator import sites
from drain_router.activator.sites import ServiceSite
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
    sites.NOT_FOUND[1]: sites.GRPC_NOT_FOUND,
    sites.UNAVAILABLE[1]: sites.GRPC_UNAVAILABLE,
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
    for it are answered UNAVAILABLE now (and new ones at once, :meth:`GrpcPortSites.pick`)."""
    site.grpc_port, site.grpc_port_read = port, True
    if port is None and site.grpc is not None:
        site.table.own.refused.labels("no_grpc_port").inc(site.grpc.refuse_held(NO_GRPC_PORT))


class GrpcPortSites:
    """The picker of one ``grpc`` port's listener (its :class:`~drain_router.grpc.inbound.Sites`):
    every call's destination is the port's service, with its :class:`GrpcSite`."""

    def __init__(self, site: ServiceSite) -> None:
        self.site = site
        self.listener: GrpcListener | None = None
        """Set once made (it is made with this)."""

    def pick(self, conn: Connection, stream: Stream, headers: Headers, request: Request, end: bool) -> GrpcSite | None:
        listener = self.listener
        assert listener is not None
        site = self.site
        if request.path in health.PATHS:
            answer = HEALTH
        elif site.grpc_port is None and (site.grpc_port_read or site.forwarding):
            site.table.own.refused.labels("no_grpc_port").inc()
            answer = NO_GRPC_PORT
        else:
            dest = site.pick(headers)
            if isinstance(dest, ServiceSite):
                if dest.grpc is None:
                    dest.grpc = GrpcSite(dest, listener)
                return dest.grpc  # type: ignore[no-any-return]
            answer = REFUSALS[dest.refusal[1]]
        Call(listener, conn, stream, headers, request, end, counted=False).reject(*answer)
        return None
