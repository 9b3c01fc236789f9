"""Bounds under pipelining ("Bounds both ways"): one slow request (the upstream never answers
it) followed by thousands of pipelined GETs in one write, on each of a few dozen connections. The
router must stop reading behind the slow request: its RSS grows by a bounded amount, ``/admin/inflight``
never reads more than a small constant per connection (a pipelined request counts from the moment its
exchange starts, not when it is parsed), and it returns to 0 once the clients leave, although the
upstream stays silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psutil
import pytest

from drain_router_dev.process import wait_until
from tests.blackbox import inflight, reset, wait_idle
from tests.conformance import wire
from tests.process import RouterProcess
from tests.rawupstream import pattern

#: In flight per connection at most: the slow request (and, generously, one more being started).
PER_CONNECTION = 2
RSS_GROWTH_BYTES = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def world() -> Iterator[wire.World]:
    with wire.world("--client-header-timeout-secs", "30") as w:
        yield w


async def flood(p: RouterProcess, up: wire.Upstream, connections: int, pipelined: int, upload: int = 0) -> None:
    """Each connection sends a request the upstream never answers (a GET, or a POST with an
    ``upload``-byte body the upstream reads whole) and ``pipelined`` GETs behind it in one write."""
    assert p.port is not None and p.admin_port is not None
    port, admin_port = p.port, p.admin_port
    router = psutil.Process(p.proc.pid)
    baseline = router.memory_info().rss
    slow = [wire.new_id("slow") for _ in range(connections)]
    for rid in slow:
        up.scripts[rid] = wire.Script([], then="hold")
    behind = b"GET /behind HTTP/1.1\r\nHost: model\r\n\r\n" * pipelined
    clients = [await wire.Client.open(port) for _ in range(connections)]
    peak_rss, peak_inflight = baseline, 0

    async def sample() -> None:
        nonlocal peak_rss, peak_inflight
        peak_rss = max(peak_rss, router.memory_info().rss)
        peak_inflight = max(peak_inflight, int((await inflight(admin_port))["inflight"]))

    sends = [
        asyncio.ensure_future(
            c.send(
                (
                    b"POST /slow HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\nContent-Length: %d\r\n\r\n%s"
                    % (rid.encode(), upload, pattern(upload))
                    if upload
                    else b"GET /slow HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\n\r\n" % rid.encode()
                )
                + behind
            )
        )
        for c, rid in zip(clients, slow)
    ]

    async def arrived() -> int:
        await sample()
        return sum(1 for rid in slow if up.by_id(rid))

    try:
        # Until every slow request is at the upstream and every client's write went into the
        # kernel or the router (or 5 s: a router that stopped reading holds the rest back).
        await wait_until(arrived, 10, "every slow request at the upstream", until=lambda n: n == len(slow))
        await asyncio.wait(sends, timeout=5)
        for _ in range(20):
            await sample()
        behind_seen = sum(1 for s in up.seen if s.target == b"/behind")
        grown = peak_rss - baseline
        faults = []
        if behind_seen:
            faults.append(f"{behind_seen} pipelined requests overtook the slow one")
        if peak_inflight > connections * PER_CONNECTION:
            faults.append(
                f"in-flight read {peak_inflight} with {connections} connections each blocked behind one request"
            )
        if grown >= RSS_GROWTH_BYTES:
            faults.append(f"the router's RSS grew by {grown / 2**20:.0f} MiB")
        assert not faults, faults
    finally:
        for s in sends:
            s.cancel()
        for c in clients:
            # Leave with a reset: a FIN queued behind unsent pipelined bytes (the router is not
            # reading them, as the router's bounds ask) cannot reach the router until they are read, so only a
            # reset is a departure TCP can show it (docs/proxying.md).
            reset(c.writer)
    await wait_idle(admin_port, timeout=10)


def test_pipelined_floods_behind_a_silent_request_cost_bounded_memory_and_inflight(world):
    world.run(flood(world.router, world.up, connections=30, pipelined=20_000), timeout=60)


def test_pipelined_floods_behind_an_upload_cost_bounded_memory_and_inflight(world):
    """The flood arrives in the read that ends a 1 MiB body (the router skips the body when it looks
    for request heads; it must skip only the body)."""
    world.run(flood(world.router, world.up, connections=30, pipelined=20_000, upload=1 << 20), timeout=60)
