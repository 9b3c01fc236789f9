"""The product's claim: no request lost across rolling restarts behind a probe-driven balancer.

Behind HAProxy and behind Envoy (each its own run): the balancer checks each replica's /readyz every
200 ms (one failure out, one success in), pools keep-alive connections to them and never retries. Clients stream completions through it while the replicas are restarted one
at a time with SIGTERM, five full cycles. With the drain on nothing may be lost; the same scenario
with ``--shutdown-drain-secs 0`` must lose requests, which proves the harness can see a loss.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import aiohttp
import pytest

from drain_router_dev import load
from drain_router_dev.process import wait_until
from e2e.rolling import restart_in_turn

CYCLES = 5
REPLICAS = 2
CLIENTS = 12
CHUNKS = 8
INTERVAL_MS = 40  # ~0.3 s per stream
PROBE_INTER_MS = 200
DRAIN_SECS = 1  # five probe intervals: HAProxy has long marked the replica down when it closes


def _describe(lost: list[load.Record]) -> str:
    outcomes = collections.Counter(r.outcome.value for r in lost)
    errors = collections.Counter(f"{r.status} {r.error}" for r in lost)
    return f"{dict(outcomes)}; e.g. {errors.most_common(3)}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("drain_secs", [DRAIN_SECS, 0], ids=["drain-on", "drain-off"])
async def test_rolling_restarts_through_balancer(
    drain_secs: int,
    balancer_kind: str,
    start_fake_model: Any,
    start_replica: Any,
    start_balancer: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """1. clients stream through the balancer to two replicas 2. each replica in turn: SIGTERM, wait for
    its exit, start it again on the same port, wait until the balancer sees it UP 3. five cycles.
    Result: drain on, zero lost and the model server cancelled nothing; drain off, some lost."""
    model = await start_fake_model(chunks=CHUNKS, interval_ms=INTERVAL_MS)
    replicas = [await start_replica(f"replica-{i}", model.url, shutdown_drain_secs=drain_secs) for i in range(REPLICAS)]
    lb = await start_balancer(balancer_kind, replicas, inter_ms=PROBE_INTER_MS)

    # Staggered: requests arrive at a steady rate. In waves (all clients in step, one wave per stream
    # length) the no-drain control could miss every short window in which the balancer still sends to
    # a replica that has closed its listener, and lose nothing by luck (seen once in CI: 0 of 300).
    stream_load = load.Load(lb.url, clients=CLIENTS, chunks=CHUNKS, interval_ms=INTERVAL_MS, stagger=True)
    started = time.monotonic()
    await stream_load.start()
    try:
        want = 2 * CLIENTS
        await wait_until(lambda: len(stream_load.records), 20, f"{want} finished requests", until=lambda n: n >= want)
        assert not stream_load.lost, f"lost before any restart: {_describe(stream_load.lost)}"
        exit_codes, _ = await restart_in_turn(replicas, lb, session, CYCLES)
        want = len(stream_load.records) + 2 * CLIENTS
        await wait_until(lambda: len(stream_load.records), 20, f"{want} finished requests", until=lambda n: n >= want)
    finally:
        records = await stream_load.stop()
    elapsed = time.monotonic() - started
    lost = stream_load.lost
    stats = await model.stats(session)

    report.append(
        f"{balancer_kind}, --shutdown-drain-secs {drain_secs}: {len(lost)} lost of {len(records)} requests, "
        f"{CYCLES} cycles x {REPLICAS} replicas in {elapsed:.1f}s" + (f" ({_describe(lost)})" if lost else "")
    )
    assert exit_codes == [0] * (CYCLES * REPLICAS)
    if drain_secs:
        assert not lost, f"{len(lost)} of {len(records)} lost with the drain on: {_describe(lost)}"
        assert stats["cancelled"] == 0, stats
    else:
        assert lost, f"no request lost in {len(records)} with --shutdown-drain-secs 0: the harness cannot see a loss"
