"""The deadline-abort alert, evaluated by a real Prometheus scraping real routers through rolling
restarts: pending or firing when a faulted restart aborted streams at the deadline, silent on a clean
one.

The fleet is ``e2e/chaos.py``'s (two pods: a fake model server and a router each, a real HAProxy,
streaming and gRPC clients), without realtime sessions, which every restart would hold to its
router's deadline. Prometheus scrapes every router's admin ``/metrics`` every 200 ms and evaluates
the model chart's PrometheusRule (rendered by the real helm) every 200 ms, its ``for`` at 0 and
``atRiskSeconds`` at 1 (the routers' deadline is t0 + 3 s, their drain window 1 s: a clean restart's
streams end long before t0 + 2 s). Every wait has a deadline; nothing sleeps for time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import aiohttp
import pytest

from drain_router_dev.process import Process, wait_until
from e2e import chaos, prometheus
from tests.chart.helm import obtain_helm

ALERT = "DrainRouterDeadlineAborts"
VALUES = {"deadlineAborts": {"for": "0s", "atRiskSeconds": 1, "window": "1m"}}
EVAL_WAIT_SECS = 10.0


@pytest.fixture
def prometheus_bin(haproxy_bin: str) -> str:
    exe = prometheus.binary()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed but CI is set: .ci/run must install it")
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus)")
    return exe


async def _rollout(
    fault: str, session: aiohttp.ClientSession, processes: list[Process], tmp_path: Path
) -> tuple[chaos.Fleet, prometheus.Prometheus, float]:
    """Start the fleet and Prometheus, run one rolling-restart cycle with ``fault``; returns them and
    the Unix time the cycle started."""
    try:
        helm = obtain_helm()
    except RuntimeError as exc:
        pytest.skip(f"helm could not be obtained: {exc}")
    rules = prometheus.render_rules(helm, VALUES, tmp_path)
    fleet = chaos.Fleet(tmp_path, "haproxy", session, processes.append, seed=38, session_clients=0)
    await fleet.start()
    targets = [f"127.0.0.1:{pod.replica.admin_port}" for pod in fleet.pods]
    prom = prometheus.Prometheus(tmp_path / "prometheus", rules, targets)
    processes.append(prom.process)
    await prom.start(session)
    await wait_until(
        lambda: len(fleet.load.records), 20, "the first streams to finish", until=lambda n: n >= chaos.CLIENTS
    )
    await prom.evaluated_after(session, time.time(), EVAL_WAIT_SECS)
    assert await prom.alert_seen(session, ALERT, time.time() - 60) == [], "firing before any restart"
    started = time.time()
    try:
        await fleet.cycle(1, fault)
    finally:
        await fleet.load.stop()
        await fleet.realtime.stop()
        await fleet.grpc.stop()
    return fleet, prom, started


@pytest.mark.timeout(60)
async def test_deadline_abort_alert_fires_when_streams_are_aborted(
    prometheus_bin: str, session: aiohttp.ClientSession, processes: list[Process], tmp_path: Path
) -> None:
    """1. two pods behind HAProxy, Prometheus scraping and evaluating 2. one pod's model server
    frozen, its router SIGTERMed: its streams stay in flight to the deadline, are aborted, it exits 1
    3. the other pod restarts cleanly. Result: streams were aborted (the router's own log says how
    many), and DrainRouterDeadlineAborts was pending or firing for that router."""
    fleet, prom, started = await _rollout("stall_past_deadline", session, processes, tmp_path)
    assert fleet.ledger.problems == []
    aborted = fleet.ledger.router["deadline_aborted"]
    assert aborted > 0, "the stall aborted nothing: the fault did not happen"
    seen = await wait_until(
        lambda: prom.alert_seen(session, ALERT, started), EVAL_WAIT_SECS, f"{ALERT} pending or firing"
    )
    states = {series["metric"]["alertstate"] for series in seen}
    assert states <= {"pending", "firing"} and states, seen
    instances = {series["metric"]["instance"] for series in seen}
    stalled = {f"127.0.0.1:{p.replica.admin_port}" for p in fleet.pods}
    assert instances <= stalled and len(instances) == 1, f"one router, the stalled one: {instances}"


@pytest.mark.timeout(60)
async def test_deadline_abort_alert_is_silent_on_a_clean_rollout(
    prometheus_bin: str, session: aiohttp.ClientSession, processes: list[Process], tmp_path: Path
) -> None:
    """1. as above 2. both pods restarted one at a time, cleanly: every router exits 0 3. Prometheus
    evaluates its rules after the last restart. Result: nothing aborted, and DrainRouterDeadlineAborts
    was never pending nor firing (no ALERTS series since the rollout began), and none is now."""
    fleet, prom, started = await _rollout("none", session, processes, tmp_path)
    assert fleet.ledger.problems == []
    assert fleet.ledger.router["deadline_aborted"] == 0
    await prom.evaluated_after(session, time.time(), EVAL_WAIT_SECS)
    assert await prom.alert_seen(session, ALERT, started) == []
    assert await prom.alerts(session, ALERT) == []
