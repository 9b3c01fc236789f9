"""Realtime (WebSocket) sessions across rolling restarts behind a real HAProxy and a real Envoy.

The claim: a realtime session that a rolling restart interrupts ends with a Close frame,
1000 or 1001 (Going Away), never with a 1006 (a connection lost without a Close: a reset, a cut
tunnel); a client told 1001 reconnects through the balancer and lands on a replica that is not
going away.

Two runs per balancer:

- the harness's own proof, with the balancer straight in front of the model servers (checked on
  their ``/health``): model servers that shut down as vLLM does close their open sessions with 1001
  at their deadline, and every session ends clean; model servers killed by SIGTERM
  (``--exit-on-sigterm``) cut them, and the harness must see 1006;
- the product's, with drain-router replicas between the balancer and the model servers (one model
  server per router, as in a pod), HTTP streams beside the sessions: nothing lost, every session
  clean.
"""

from __future__ import annotations

import collections
import itertools
import signal
import time
from typing import Any

import aiohttp
import pytest

from drain_router_dev import cluster, load, realtime, sessions
from drain_router_dev.process import wait_until

CYCLES = 2
PODS = 2
CLIENTS = 6
"""Realtime sessions held open at once (about three per replica)."""
DELTAS = 20
INTERVAL_MS = 20
"""One response: 20 deltas 20 ms apart, 0.4 s; a session asks for one after another."""
PROBE_INTER_MS = 200
MODEL_SHUTDOWN_SECS = 1.0
"""The model servers' --shutdown-timeout-secs: five probe intervals, so the balancer has taken a
model server out before its sessions get 1001 and reconnect."""
STREAM_CLIENTS = 6
STREAM_CHUNKS = 8
STREAM_INTERVAL_MS = 40
DRAIN_SECS = 1
GRACE_SECS = 5
"""Declared on every router: its in-flight deadline, where open sessions get 1001, is t0 + 3 s."""
WAIT_SECS = 20.0


def _describe(records: list[realtime.Record]) -> str:
    ends = collections.Counter(r.end.value for r in records)
    codes = collections.Counter(f"{r.result.handshake_status}/{r.result.close_code} {r.result.error}" for r in records)
    return f"{dict(ends)}; e.g. {codes.most_common(3)}"


def reconnects(records: list[realtime.Record]) -> tuple[int, list[str]]:
    """How many sessions that ended with 1001 were followed, on the same client, by a session on
    another server; and the ones that were not (reconnected to the same server, or not at all)."""
    by_worker: dict[int, list[realtime.Record]] = collections.defaultdict(list)
    for record in records:
        by_worker[record.worker].append(record)
    moved, wrong = 0, []
    for worker, rows in by_worker.items():
        for this, following in itertools.pairwise(rows):
            if this.end is not sessions.End.GOING_AWAY:
                continue
            if following.end.clean and following.server is not None and following.server != this.server:
                moved += 1
            else:
                wrong.append(
                    f"client {worker}: 1001 from {this.server}, then {following.end.value} on {following.server}"
                )
    return moved, wrong


async def _wait_open(holder: realtime.Sessions, count: int) -> None:
    await wait_until(lambda: holder.open, WAIT_SECS, f"{count} realtime sessions open", until=lambda n: n >= count)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shutdown", ["graceful", "killed"])
async def test_sessions_through_balancer_to_model_servers(
    shutdown: str,
    balancer_kind: str,
    start_fake_model: Any,
    start_balancer: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """The harness's proof. 1. realtime sessions through the balancer to two model servers 2. each
    model server in turn: SIGTERM, its exit, start it again, seen UP, every session open again
    3. two cycles. Result: graceful (vLLM's shutdown, 1 s): every session ends 1000 or 1001, and
    every 1001 is followed by a session on the other model server; killed: some end 1006."""
    graceful = shutdown == "graceful"
    models = [
        await start_fake_model(
            name=f"model-{i}",
            chunks=DELTAS,
            interval_ms=INTERVAL_MS,
            exit_on_sigterm=not graceful,
            shutdown_timeout_secs=MODEL_SHUTDOWN_SECS,
        )
        for i in range(PODS)
    ]
    lb = await start_balancer(balancer_kind, models, inter_ms=PROBE_INTER_MS, check_path="/health")
    assert await realtime.handshake_status(session, lb.url) == 101, f"{balancer_kind} does not forward the upgrade"

    holder = realtime.Sessions(lb.url, clients=CLIENTS, deltas=DELTAS, interval_ms=INTERVAL_MS)
    started = time.monotonic()
    await holder.start()
    try:
        await _wait_open(holder, CLIENTS)
        for _cycle in range(CYCLES):
            for model in models:
                model.process.signal(signal.SIGTERM)
                code = await model.process.wait_exit(timeout=WAIT_SECS)
                assert code == (0 if graceful else -signal.SIGTERM), f"{model.name} exited {code}"
                await model.start(session)
                await lb.wait_status(model.name, "UP")
                await _wait_open(holder, CLIENTS)
    finally:
        records = await holder.stop()
    unclean = [r for r in records if not r.end.clean]
    moved, wrong = reconnects(records)
    report.append(
        f"{balancer_kind}, model servers {shutdown}: {len(records)} sessions, {len(unclean)} unclean, "
        f"{moved} reconnected elsewhere after 1001, in {time.monotonic() - started:.1f}s"
        + (f" ({_describe(unclean)})" if unclean else "")
    )
    if graceful:
        assert not unclean, (
            f"{len(unclean)} of {len(records)} sessions did not end with 1000 or 1001: {_describe(unclean)}"
        )
        assert not wrong, wrong
        assert moved >= CYCLES * PODS, f"only {moved} reconnects after 1001 in {CYCLES * PODS} restarts"
    else:
        abnormal = [r for r in unclean if r.end is sessions.End.ABNORMAL]
        assert abnormal, (
            f"no session ended 1006 with killed model servers: the harness cannot see a cut ({_describe(records)})"
        )


@pytest.mark.timeout(240)
async def test_sessions_and_streams_through_balancer_to_routers(
    balancer_kind: str,
    start_fake_model: Any,
    start_replica: Any,
    start_balancer: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """The product's claim. 1. two pods (a model server and a router in front of it) behind the
    balancer; HTTP streams and realtime sessions through it 2. each router in turn: SIGTERM, its
    exit (1 when sessions were still open at the deadline: they got 1001 there), start it again,
    seen UP, every session open again 3. two cycles. Result: no stream lost; every session ends
    1000 or 1001, none 1006; every 1001 is followed by a session on the other pod."""
    pods: list[tuple[cluster.FakeModel, cluster.Replica]] = []
    for i in range(PODS):
        model = await start_fake_model(name=f"model-{i}", chunks=DELTAS, interval_ms=INTERVAL_MS)
        replica = await start_replica(
            f"router-{i}", model.url, shutdown_drain_secs=DRAIN_SECS, termination_grace_secs=GRACE_SECS
        )
        pods.append((model, replica))
    status = await realtime.handshake_status(session, pods[0][1].url)
    assert status == 101, f"the router answered the WebSocket handshake with {status}"
    lb = await start_balancer(balancer_kind, [replica for _, replica in pods], inter_ms=PROBE_INTER_MS)

    streams_load = load.Load(lb.url, clients=STREAM_CLIENTS, chunks=STREAM_CHUNKS, interval_ms=STREAM_INTERVAL_MS)
    holder = realtime.Sessions(lb.url, clients=CLIENTS, deltas=DELTAS, interval_ms=INTERVAL_MS)
    exit_codes: list[int] = []
    started = time.monotonic()
    await streams_load.start()
    await holder.start()
    try:
        await _wait_open(holder, CLIENTS)
        for _cycle in range(CYCLES):
            for _, replica in pods:
                replica.sigterm()
                exit_codes.append(await replica.process.wait_exit(timeout=GRACE_SECS + WAIT_SECS))
                await replica.start(session)
                await lb.wait_status(replica.name, "UP")
                await _wait_open(holder, CLIENTS)
    finally:
        records = await holder.stop()
        stream_records = await streams_load.stop()
    unclean = [r for r in records if not r.end.clean]
    lost = streams_load.lost
    moved, wrong = reconnects(records)
    report.append(
        f"{balancer_kind}, routers: {len(records)} sessions, {len(unclean)} unclean, {moved} reconnected "
        f"elsewhere after 1001; {len(lost)} of {len(stream_records)} streams lost; exits {exit_codes}; "
        f"{time.monotonic() - started:.1f}s" + (f" ({_describe(unclean)})" if unclean else "")
    )
    assert set(exit_codes) <= {0, 1}, exit_codes
    assert not lost, f"{len(lost)} of {len(stream_records)} streams lost"
    assert not unclean, f"{len(unclean)} of {len(records)} sessions did not end with 1000 or 1001: {_describe(unclean)}"
    assert not wrong, wrong
    assert moved >= CYCLES * PODS, f"only {moved} reconnects after 1001 in {CYCLES * PODS} restarts"
