"""Process tuning for serving: the open-files limit, the descriptor reserve, the garbage collector."""

from __future__ import annotations

import contextlib
import gc
import resource
from collections.abc import Iterator

#: Descriptors kept free of client traffic for the admin listener (probes, metrics, preStop), the
#: upstream health check and the process itself; see :func:`traffic_connection_limit`.
ADMIN_RESERVE_FDS = 64

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
    descriptors (client and upstream), and :data:`ADMIN_RESERVE_FDS` stay for the admin listener.
    Without an argument, from the process's current soft limit."""
    if nofile_soft is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile_soft = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max((nofile_soft - ADMIN_RESERVE_FDS) // 2, 1)


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
