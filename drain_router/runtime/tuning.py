"""Process tuning for serving: the open-files limit, the descriptor reserve, the garbage collector."""

from __future__ import annotations

import contextlib
import gc
import resource
from collections.abc import Iterator

#: Connections the admin listener holds at once; past it a connection is answered 503 and closed
#: (:mod:`drain_router.runtime.admin_listener`). A pod's legitimate admin clients at any moment are a handful:
#: the kubelet's probes (one short connection each), one or two Prometheus scrapers, the controller's
#: idle probe, the preStop holds on ``/admin/drain-wait`` (at most ``MAX_DRAIN_WAITERS``, 16) and an
#: operator's curl. 64 leaves 48 for probes and scrapes even with every drain-wait slot held, and
#: bounds what a flood of admin connections can take from the traffic listener.
ADMIN_CONNECTION_LIMIT = 64

#: Admin connections accepted past :data:`ADMIN_CONNECTION_LIMIT` for the probes alone: on one of
#: them ``/livez`` and ``/readyz`` are answered (and the connection closed), any other path is refused
#: 503, and one that sends nothing is closed after ``ADMIN_RESERVE_IDLE_SECS``. So whatever holds the
#: cap (scrapes, preStop holds, clients that never read), the kubelet's probes are still answered
#: rather than failed into a restart.
ADMIN_PROBE_RESERVE = 8

#: Refused admin connections kept open at once for up to a second, so that their 503 is read rather
#: than lost to a reset; more are closed as soon as they are answered.
ADMIN_LINGERING_REFUSED = 8

#: Descriptors of the process itself: stdio, the event loop's, the listening sockets, the upstream
#: health check (15 in all, measured at startup), plus the traffic listener's refused connections
#: lingering for their 503 (up to 16) and some headroom.
PROCESS_RESERVE_FDS = 40

#: Descriptors kept free of client traffic: the admin listener's own share (its connection cap, its
#: probes' reserve and its lingering refusals) and the process's. Each listener is bounded by its own share, so neither can
#: starve the other of descriptors; see :func:`traffic_connection_limit`.
RESERVED_FDS = ADMIN_CONNECTION_LIMIT + ADMIN_PROBE_RESERVE + ADMIN_LINGERING_REFUSED + PROCESS_RESERVE_FDS

#: Generation-0 threshold of the cyclic garbage collector while serving (CPython's default is 700).
#: Every request allocates a few hundred container objects, so the default runs a collection every
#: couple of requests; measured in bench/, 50,000 cut CPU per small GET by ~10 % and per relayed
#: chunk by ~7 %. Reference counting still frees almost everything at once; only cycles wait longer.
GC_GEN0_THRESHOLD = 50_000


def raise_open_files_limit() -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit: 10k streams need 20k descriptors.
    Returns (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    return soft, target, hard


def traffic_connection_limit(nofile_soft: int | None = None) -> int:
    """Client connections the traffic listener accepts at once: each proxied request holds two
    descriptors (client and upstream), and :data:`RESERVED_FDS` stay for the admin listener and the
    process itself. Without an argument, from the process's current soft limit."""
    if nofile_soft is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile_soft = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max((nofile_soft - RESERVED_FDS) // 2, 1)


#: With ``--grpc-port``, the gRPC listener's share of the traffic connection limit: an HTTP/2
#: connection carries up to 100 streams, so an eighth of the descriptors carries more streams than
#: the rest carry requests.
GRPC_SHARE = 8


def grpc_connection_limit(traffic_limit: int) -> int:
    """The gRPC listener's connection cap, taken out of :func:`traffic_connection_limit`'s so the two
    listeners together stay inside the descriptor budget."""
    return max(traffic_limit // GRPC_SHARE, 1)


@contextlib.contextmanager
def serving_gc() -> Iterator[None]:
    """Collect and freeze what startup allocated, run with a larger gen-0 threshold, and freeze again
    at the end: what lives until exit is never walked by the collector again (the final collection
    at interpreter exit measured 110-200 ms after the last stream), and the hot path collects less."""
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, threshold[1], threshold[2])
    try:
        yield
    finally:
        gc.freeze()  # what the run left behind is freed by the OS at exit, not walked by the collector
