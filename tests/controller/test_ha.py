"""Two ``drain-router controller`` processes against the emulated API server, as two replicas of the
chart's Deployment: one acts, the other stands by; the leader is killed, partitioned from its Lease,
or stopped, and the standby takes over within the stated bound, never while the leader still acts.
Durations are configured short (lease 2 s, renew deadline 1 s, retry 0.2 s); every wait is a poll
with a deadline."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest

from drain_router.controller import operator
from drain_router_dev import process as process_

from .conftest import MSVC, NAMESPACE, eventually
from .emulator import LEASES, ClusterEmulator, LeaseWrite
from .rules_scenario import make_service, ready_pods
from .test_command import REPO, _env, _kubeconfig

LEASE = "drain-router-controller"
DURATION, RENEW, RETRY = 2, 1.0, 0.2
BOUND = DURATION + RETRY
"""The stated takeover bound: lease duration + retry period after the leader's last renewal."""
SLACK = 1.0
"""API round trips and this machine's load (two cores, other test processes)."""


class Replica:
    """One controller process and what it logged."""

    def __init__(self, proc: process_.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        for line in self.proc.new_lines():
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.events.append({"event": line, "level": "raw"})
        return self.events

    def logged(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.read() if e.get("event") == event), None)

    @property
    def identity(self) -> str:
        standing = self.logged("leader.standing_by")
        assert standing is not None, self.proc.log_tail()
        return str(standing["identity"])

    def acted(self) -> list[dict[str, Any]]:
        """Everything it logged that is not the election's: kopf's records, the handlers' lines."""
        return [e for e in self.read() if not str(e.get("event", "")).startswith(("leader.", "--- start"))]


@pytest.fixture
async def replicas(
    cluster: tuple[ClusterEmulator, kmock.Server], tmp_path: Path
) -> AsyncIterator[Callable[..., Replica]]:
    """Factory: ``start("a", "--leader-election-lease-duration", "5")``; every process killed after."""
    _, server = cluster
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", str(server.url).rstrip("/"))
    started: list[Replica] = []

    def start(name: str, *extra: str) -> Replica:
        argv = [
            *(
                "-m",
                "drain_router",
                "controller",
                "--namespace",
                NAMESPACE,
                "--metrics-port",
                "0",
                "--liveness-port",
                "0",
            ),
            *("--requeue-secs", "0.2", "--leader-election-lease-duration", str(DURATION)),
            *("--leader-election-renew-deadline", str(RENEW), "--leader-election-retry-period", str(RETRY)),
            *extra,
        ]
        proc = process_.Process(
            name,
            [sys.executable, *argv],
            tmp_path / f"{name}.log",
            env=_env(tmp_path, KUBECONFIG=str(kubeconfig), HOSTNAME=f"controller-{name}"),
            cwd=REPO,
        )
        proc.start()
        replica = Replica(proc)
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for replica in started:
            replica.proc.kill()


def holder(emu: ClusterEmulator) -> str:
    lease = emu.get(LEASES, NAMESPACE, LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def leader_and_standby(
    emu: ClusterEmulator, start: Callable[..., Replica], *extra: str
) -> tuple[Replica, Replica]:
    """a started first and holding the Lease, then b started and standing by (it has seen a's Lease)."""
    a = start("a", *extra)
    await eventually(lambda: a.logged("leader.standing_by"), what="a to start", timeout=30)
    await eventually(lambda: holder(emu) == a.identity, what="a to hold the Lease", timeout=30)
    b = start("b", *extra)
    await eventually(lambda: b.logged("leader.standby"), what="b to stand by behind a", timeout=30)
    return a, b


def takeover(emu: ClusterEmulator, identity: str) -> LeaseWrite | None:
    return next((w for w in emu.lease_writes if w.holder == identity), None)


async def test_one_acts_and_a_killed_leader_is_replaced_mid_recycle_each_pod_evicted_once(
    cluster: tuple[ClusterEmulator, kmock.Server], replicas: Callable[..., Replica]
) -> None:
    """1. three pods past their maximum lifetime, recycled one at a time (a replacement takes 2 s to
    turn Ready) 2. replicas a (leader) and b (standby) 3. a evicts the first pod 4. SIGKILL a while
    the replacement is not Ready. Result: until then b did nothing at all (only election lines in
    its log); b holds the Lease within lease duration + retry period of a's last renewal and
    carries on: every original pod evicted exactly once overall, one at a time, the replacements
    never."""
    emu, _ = cluster
    await make_service(
        emu, admin_port=1, replicas=3, recycling={"maxPodLifetimeSeconds": 2, "maxPodLifetimeIdleTimeoutSeconds": 0}
    )
    originals = await eventually(lambda: len(p := ready_pods(emu)) == 3 and p, what="three Ready pods", timeout=15)
    names = {p["metadata"]["name"] for p in originals}
    emu.ready_after = 2.0
    # No replacement turns Ready until a is killed, however slowly this process runs: a is killed
    # mid-recycle, with exactly its first eviction done (one at a time holds it there).
    emu.pod_may_be_ready = lambda pod: False
    a, b = await leader_and_standby(emu, replicas)
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="a's first eviction", timeout=30)
    assert not b.acted(), f"the standby acted: {b.acted()}"
    assert len([e for e in emu.evictions if e.code == 201]) == 1
    a.proc.kill()
    emu.pod_may_be_ready = None
    taken = await eventually(lambda: takeover(emu, b.identity), what="b to take the Lease", timeout=BOUND + 10)
    last_renewal = max(w.at for w in emu.lease_writes if w.holder == a.identity)
    assert taken.at - last_renewal <= BOUND + SLACK, taken.at - last_renewal
    assert taken.at - last_renewal >= DURATION, "taken before the lease ran out"

    def all_recycled() -> bool:
        return {e.pod for e in emu.evictions if e.code == 201} >= names

    await eventually(all_recycled, what="every original pod evicted", timeout=40)
    done = [e.pod for e in emu.evictions if e.code == 201]
    assert sorted(done) == sorted(names), f"each original pod exactly once, no replacement: {done}"
    assert all(e.unsettled == () for e in emu.evictions if e.code == 201), "one at a time"
    assert b.acted(), "b acted after the takeover"


async def test_a_partitioned_leader_stops_acting_before_the_standby_takes_over(
    cluster: tuple[ClusterEmulator, kmock.Server], replicas: Callable[..., Replica]
) -> None:
    """1. a leads, b stands by 2. every Lease renewal of a's fails (500), everything else of a's still
    works (a partial partition). Result: a stops acting, by exiting with status 3
    (EXIT_LEADERSHIP_LOST), before b's takeover lands: at the moment the API server accepts b's
    write, a's process is already gone. b takes over within the bound."""
    emu, _ = cluster
    a, b = await leader_and_standby(emu, replicas)
    a_id = a.identity
    overlap: list[str] = []

    def on_write(write: LeaseWrite) -> None:
        if write.holder == b.identity and a.proc.alive:
            overlap.append(f"b took the Lease at {write.at:.3f} while a was still running")

    emu.on_lease_write = on_write
    emu.fail_when(
        lambda r: r.method == "PUT" and ((r.data or {}).get("spec") or {}).get("holderIdentity") == a_id,
        500,
        "InternalError",
        "etcdserver: request timed out",
    )
    assert await a.proc.wait_exit(timeout=RENEW + 5) == operator.EXIT_LEADERSHIP_LOST, a.proc.log_tail()
    assert a.logged("leader.lost")
    taken = await eventually(lambda: takeover(emu, b.identity), what="b to take the Lease", timeout=BOUND + 10)
    last_renewal = max(w.at for w in emu.lease_writes if w.holder == a_id)
    assert not overlap, overlap
    assert taken.at - last_renewal <= BOUND + SLACK, taken.at - last_renewal


async def test_sigterm_releases_the_lease_so_the_standby_takes_over_at_once(
    cluster: tuple[ClusterEmulator, kmock.Server], replicas: Callable[..., Replica]
) -> None:
    """1. a leads, b and c stand by, lease duration 15 s; b answers /healthz and reports
    drain_router_controller_leader 0 while standing by 2. SIGTERM to c: it exits 0 at once, having
    done nothing, and a keeps the Lease 3. SIGTERM to a. Result: a stops kopf, releases the Lease
    and exits 0; b holds the Lease within a retry period or so of the release, long before the 15 s an expiry would take; b's /healthz is now kopf's, its
    gauge 1."""
    emu, _ = cluster
    port = process_.free_port()
    slow = ("--leader-election-lease-duration", "15", "--leader-election-renew-deadline", "10")
    a = replicas("a", *slow)
    await eventually(lambda: a.logged("leader.standing_by"), what="a to start", timeout=30)
    await eventually(lambda: holder(emu) == a.identity, what="a to hold the Lease", timeout=30)
    metrics = process_.free_port()
    b = replicas("b", *slow, "--liveness-port", str(port), "--metrics-port", str(metrics))
    c = replicas("c", *slow)
    await eventually(lambda: b.logged("leader.standby"), what="b to stand by behind a", timeout=30)
    await eventually(lambda: c.logged("leader.standby"), what="c to stand by behind a", timeout=30)
    c.proc.signal(signal.SIGTERM)
    assert await c.proc.wait_exit(timeout=5) == 0, c.proc.log_tail()
    assert not c.acted() and holder(emu) == a.identity
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 200, "a standby is alive"
        assert await leader_gauge(session, metrics) == 0.0
    sent = time.time()
    a.proc.signal(signal.SIGTERM)
    taken = await eventually(lambda: takeover(emu, b.identity), what="b to take the Lease", timeout=30)
    assert taken.at - sent < 15, f"took {taken.at - sent:.1f}s: the lease duration was waited out"
    assert await a.proc.wait_exit(timeout=20) == 0, a.proc.log_tail()
    assert a.logged("leader.released")
    released = next(w for w in emu.lease_writes if not w.holder)
    assert 0 <= taken.at - released.at <= RETRY + SLACK, taken.at - released.at
    async with aiohttp.ClientSession() as session:
        await process_.wait_until(lambda: leader_gauge(session, metrics), 10, "b's leader gauge at 1")
        await process_.wait_until(lambda: kopf_health(session, port), 10, "kopf's /healthz on b's liveness port")
        assert b.acted() and not c.acted()


async def kopf_health(session: aiohttp.ClientSession, port: int) -> bool:
    """kopf's liveness endpoint answers (its body is its probes' results, not the standby's)."""
    try:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
            return response.status == 200 and "standby" not in await response.text()
    except aiohttp.ClientError:
        return False


async def leader_gauge(session: aiohttp.ClientSession, port: int) -> float:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    (line,) = [line for line in text.splitlines() if line.startswith("drain_router_controller_leader ")]
    return float(line.split()[1])


def test_leader_election_flags_reach_the_settings_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On by default, with client-go's durations, the Lease in the one watched namespace (or the
    service account's, or the flag's), and an identity of the pod name plus a per-process suffix.
    A renew deadline not below the lease duration, fewer than two retries per deadline, a lease
    shorter than a second, or no namespace to put the Lease in: refused, naming the value and why."""
    from click.testing import CliRunner

    from drain_router import cli
    from drain_router.controller import command, settings

    received: list[settings.ControllerSettings] = []
    monkeypatch.setattr(operator, "run", lambda cfg: received.append(cfg) or 0)
    monkeypatch.setattr(command, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    monkeypatch.setenv("HOSTNAME", "controller-7d9f-abcde")

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(cli.main, ["controller", *args])

    assert invoke("--namespace", "models").exit_code == 0
    assert invoke("--namespace", "models").exit_code == 0
    first, second = received
    assert first.leader_election and first.lease_name == "drain-router-controller" and first.lease_namespace == "models"
    assert (first.lease_duration_secs, first.renew_deadline_secs, first.retry_period_secs) == (15, 10.0, 2.0)
    assert first.takeover_bound_secs == 17
    assert first.identity.startswith("controller-7d9f-abcde_") and first.identity != second.identity
    (tmp_path / "sa").write_text("drain-router-system\n")
    monkeypatch.setattr(command, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "sa")
    assert invoke("--all-namespaces").exit_code == 0
    assert received[-1].lease_namespace == "drain-router-system", "the pod's own namespace"
    flags = ["--leader-election-namespace", "ops", "--leader-election-lease", "llm-controller"]
    durations = ["--leader-election-lease-duration", "30", "--leader-election-renew-deadline", "20"]
    assert invoke("--all-namespaces", *flags, *durations, "--leader-election-retry-period", "4").exit_code == 0
    chosen = received[-1]
    assert (chosen.lease_namespace, chosen.lease_name) == ("ops", "llm-controller")
    assert (chosen.lease_duration_secs, chosen.renew_deadline_secs, chosen.retry_period_secs) == (30, 20.0, 4.0)

    monkeypatch.setattr(command, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    for args, expected in [
        (["--all-namespaces"], "--leader-election-namespace"),
        (["--namespace", "a", "--namespace", "b"], "--leader-election-namespace"),
        (["--namespace", "a", "--leader-election-renew-deadline", "15"], "must be less than lease_duration_secs=15"),
        (["--namespace", "a", "--leader-election-retry-period", "6"], "at least twice retry_period_secs=6.0"),
        (["--namespace", "a", "--leader-election-lease-duration", "0"], "0 is not in the range x>=1"),
        (["--namespace", "a", "--leader-election-retry-period", "0"], "0.0 is not in the range x>0"),
    ]:
        result = invoke(*args)
        assert result.exit_code == 2 and expected in result.output, (args, result.output)
    assert invoke("--all-namespaces", "--no-leader-election").exit_code == 0
    assert received[-1].leader_election is False


PROMPT_RELEASE = 1.0
"""SIGTERM to the Lease's release once kopf is ready (measured 0.04-0.06 s): kopf's watches and the
service's daemon stopped, nothing waited out. It was 5.1 s: kopf's hung-task grace."""


async def test_sigterm_releases_the_lease_within_a_second(
    cluster: tuple[ClusterEmulator, kmock.Server], replicas: Callable[..., Replica]
) -> None:
    """1. a leads (lease 15 s) a ModelService with recycling rules, whose daemon has written its
    status (kopf ready, its watches open) 2. SIGTERM to a. Result: the Lease's release (the
    emulator's write with no holder) lands within PROMPT_RELEASE of the signal, and a exits 0."""
    emu, _ = cluster
    await make_service(emu, admin_port=1, replicas=1, recycling={"maxPodLifetimeSeconds": 3600})
    slow = ("--leader-election-lease-duration", "15", "--leader-election-renew-deadline", "10")
    a = replicas("a", *slow)
    await eventually(lambda: holder(emu) == a.identity if a.logged("leader.standing_by") else False, what="a to lead")
    await eventually(lambda: (emu.get(MSVC, NAMESPACE, "llama") or {}).get("status"), what="a's first pass")
    sent = time.time()
    a.proc.signal(signal.SIGTERM)
    assert await a.proc.wait_exit(timeout=20) == 0, a.proc.log_tail()
    released = next(w for w in emu.lease_writes if not w.holder)
    assert released.at - sent <= PROMPT_RELEASE, f"released {released.at - sent:.2f}s after SIGTERM"
