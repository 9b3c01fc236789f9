"""The product's claim for gRPC: no call lost across rolling restarts behind a probe-driven balancer.

The gRPC counterpart of ``e2e/test_rolling_restart.py``. Each router has a gRPC listener
(``--grpc-port``, ``--grpc-upstream`` to the fake model's vLLM engine service) behind a real HAProxy
and behind a real Envoy (each its own run), which take h2c from the clients and send each stream to
a router's gRPC port over pooled h2c connections, checking the routers every 200 ms (HAProxy:
``/readyz`` on the admin port; Envoy: ``grpc.health.v1`` on the gRPC port) and never retrying.
grpcio clients call vLLM's ``Generate`` (server streaming, numbered tokens) through the balancer
while the replicas are restarted one at a time with SIGTERM, five full cycles. With the drain on
every call must end OK with all its tokens; the same scenario with ``--shutdown-drain-secs 0`` (and
no termination grace, so nothing is cut at a deadline) must lose calls: the balancer keeps sending
new streams to a router whose listener closed until its next check, which proves the harness can
see a loss.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import aiohttp
import pytest

from drain_router_dev import grpc_load
from drain_router_dev.process import wait_until
from e2e.rolling import restart_in_turn

CYCLES = 5
REPLICAS = 2
CLIENTS = 12
TOKENS = 8
INTERVAL_MS = 40  # ~0.3 s per call
PROBE_INTER_MS = 200
DRAIN_SECS = 1  # five check intervals: the balancer has long taken the replica out when it closes


def _describe(lost: list[grpc_load.Record]) -> str:
    outcomes = collections.Counter(r.outcome.value for r in lost)
    errors = collections.Counter(f"{r.code} {r.details}" for r in lost)
    return f"{dict(outcomes)}; e.g. {errors.most_common(3)}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("drain_secs", [DRAIN_SECS, 0], ids=["drain-on", "drain-off"])
async def test_grpc_rolling_restarts_through_balancer(
    drain_secs: int,
    balancer_kind: str,
    start_fake_model: Any,
    start_replica: Any,
    start_balancer: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """1. clients call Generate through the balancer's gRPC side to two routers 2. each router in
    turn: SIGTERM, wait for its exit, start it again on the same ports, wait until the balancer has
    it UP on both sides 3. five cycles. Result: drain on, every call OK with every token, calls were
    in flight at the SIGTERMs, and the model server had none cancelled or cut; drain off, some lost."""
    model = await start_fake_model(chunks=TOKENS, interval_ms=INTERVAL_MS, grpc=True)
    replicas = [
        await start_replica(f"replica-{i}", model.url, grpc_upstream=model.grpc_url, shutdown_drain_secs=drain_secs)
        for i in range(REPLICAS)
    ]
    lb = await start_balancer(balancer_kind, replicas, inter_ms=PROBE_INTER_MS, grpc=True)

    # Staggered over one call's length: calls arrive at a steady rate. In waves the no-drain control
    # could miss every short window in which the balancer still sends to a closed listener.
    calls = grpc_load.GrpcLoad(lb.grpc_target, clients=CLIENTS, tokens=TOKENS, stagger_secs=TOKENS * INTERVAL_MS / 1000)
    started = time.monotonic()
    await calls.start()
    try:
        want = 2 * CLIENTS
        await wait_until(lambda: len(calls.records), 20, f"{want} finished calls", until=lambda n: n >= want)
        assert not calls.lost, f"lost before any restart: {_describe(calls.lost)}"
        exit_codes, sigterms = await restart_in_turn(replicas, lb, session, CYCLES)
        want = len(calls.records) + 2 * CLIENTS
        await wait_until(lambda: len(calls.records), 20, f"{want} finished calls", until=lambda n: n >= want)
    finally:
        records = await calls.stop()
    elapsed = time.monotonic() - started
    lost = calls.lost
    across = sum(1 for r in records if any(r.started < t < r.finished for t in sigterms))
    grpc_stats = (await model.stats(session))["grpc"]

    report.append(
        f"gRPC {balancer_kind}, --shutdown-drain-secs {drain_secs}: {len(lost)} lost of {len(records)} calls "
        f"({across} in flight at a SIGTERM), {CYCLES} cycles x {REPLICAS} replicas in {elapsed:.1f}s"
        + (f" ({_describe(lost)})" if lost else "")
    )
    assert exit_codes == [0] * (CYCLES * REPLICAS)
    if drain_secs:
        assert not lost, f"{len(lost)} of {len(records)} lost with the drain on: {_describe(lost)}"
        assert across >= CYCLES * REPLICAS, f"only {across} calls spanned a SIGTERM: the drain was not exercised"
        assert (grpc_stats["cancelled"], grpc_stats["shutdown_aborted"], grpc_stats["failed"]) == (0, 0, 0), grpc_stats
    else:
        assert lost, f"no call lost in {len(records)} with --shutdown-drain-secs 0: the harness cannot see a loss"
