"""The Lease election (drain_router.controller.leader) against the emulated API server: two electors in
this process, short configured durations, every wait a poll with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest
import structlog
from kubernetes_asyncio import client

from drain_router.controller import leader

from .conftest import NAMESPACE, eventually
from .emulator import LEASES, ClusterEmulator

LEASE = "drain-router-controller"
DURATION, RENEW, RETRY = 2, 1.0, 0.2


@pytest.fixture
async def electors(cluster: tuple[ClusterEmulator, kmock.Server]) -> AsyncIterator[Callable[..., leader.Elector]]:
    """Factory of electors, each with its own API client (as two replicas have)."""
    apis: list[client.ApiClient] = []

    def make(identity: str, **overrides: Any) -> leader.Elector:
        api = client.ApiClient(client.Configuration(host=str(cluster[1].url).rstrip("/")))
        apis.append(api)
        fields: dict[str, Any] = {
            "api": api,
            "namespace": NAMESPACE,
            "name": LEASE,
            "identity": identity,
            "lease_duration": DURATION,
            "renew_deadline": RENEW,
            "retry_period": RETRY,
            "log": structlog.get_logger(),
            **overrides,
        }
        return leader.Elector(**fields)

    try:
        yield make
    finally:
        for api in apis:
            await api.close()


def holder(emu: ClusterEmulator) -> str:
    lease = emu.get(LEASES, NAMESPACE, LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


@contextlib.asynccontextmanager
async def task(coro: Any) -> AsyncIterator[asyncio.Task[Any]]:
    t = asyncio.create_task(coro)
    try:
        yield t
    finally:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError, leader.LeadershipLost):
            await t


def test_may_take_a_free_own_or_expired_lease_only() -> None:
    take = leader.may_take
    assert take({}, identity="a", seen_for=None, default_duration=15) == (True, 0.0)
    assert take({"holderIdentity": "a"}, identity="a", seen_for=0, default_duration=15) == (True, 0.0)
    held = {"holderIdentity": "b", "leaseDurationSeconds": 15}
    assert take(held, identity="a", seen_for=None, default_duration=1) == (False, 15.0)
    assert take(held, identity="a", seen_for=14.5, default_duration=1) == (False, 0.5)
    assert take(held, identity="a", seen_for=15, default_duration=1)[0]
    assert take({"holderIdentity": "b"}, identity="a", seen_for=3, default_duration=3)[0], "no duration: our own"


def test_taken_spec_keeps_acquire_time_on_renewal_and_counts_transitions() -> None:
    first = leader.taken_spec({}, identity="a", duration=15, now=0)
    assert first["holderIdentity"] == "a" and first["leaseTransitions"] == 0
    assert first["acquireTime"] == first["renewTime"] == "1970-01-01T00:00:00.000000Z"
    renewed = leader.taken_spec(first, identity="a", duration=15, now=10)
    assert renewed["acquireTime"] == first["acquireTime"] and renewed["renewTime"].startswith("1970-01-01T00:00:10")
    assert renewed["leaseTransitions"] == 0
    taken = leader.taken_spec(renewed, identity="b", duration=15, now=20)
    assert taken["acquireTime"] == taken["renewTime"] and taken["leaseTransitions"] == 1


async def test_one_of_two_racing_electors_wins_the_other_waits(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. two electors try to create the Lease at the same moment. Result: one holds it (the
    emulator accepted exactly one create), the other is refused and stands by; while the holder
    renews, the standby never takes it."""
    emu, _ = cluster
    a, b = electors("a"), electors("b")
    results = await asyncio.gather(a.try_acquire(timeout=5), b.try_acquire(timeout=5))
    assert sorted(r[0] for r in results) == [False, True], results
    winner, loser = (a, b) if results[0][0] else (b, a)
    assert holder(emu) == winner.identity and winner.leading and not loser.leading
    assert [w.holder for w in emu.lease_writes] == [winner.identity]
    async with task(winner.keep()), task(loser.acquire()) as standby:
        renewals = len(emu.lease_writes)
        await eventually(
            lambda: len(emu.lease_writes) >= renewals + 3 * math.ceil(DURATION / RETRY) // 2,
            what="the holder renewing for more than a lease duration",
            timeout=10,
        )
        assert not standby.done() and not loser.leading
        assert {w.holder for w in emu.lease_writes} == {winner.identity}


async def test_a_stale_resource_version_loses_the_write(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. a holds the Lease 2. b writes it (as after an expiry) 3. a renews with the version it read
    before b's write. Result: 409 for a: it does not hold the Lease (optimistic concurrency)."""
    emu, server = cluster
    a = electors("a")
    assert (await a.try_acquire(timeout=5))[0]
    lease = await a._get(timeout=5)
    assert lease is not None
    response = await server.client.put(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}",
        json={**lease, "spec": {**lease["spec"], "holderIdentity": "b"}},
    )
    assert response.status == 200
    stale = await server.client.put(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}",
        json={**lease, "spec": {**lease["spec"], "holderIdentity": "a"}},
    )
    assert stale.status == 409
    body = await stale.json()
    assert body["kind"] == "Status" and body["reason"] == "Conflict" and body["code"] == 409
    assert not (await a.try_acquire(timeout=5))[0]
    assert holder(emu) == "b"


async def test_standby_takes_an_abandoned_lease_within_the_bound(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. a holds the Lease and stops renewing (dies) 2. b stands by. Result: b takes it no sooner
    than the lease duration after a's last renewal, and no later than duration + retry period
    (plus slack for the API round trips)."""
    emu, _ = cluster
    a, b = electors("a"), electors("b")
    assert (await a.try_acquire(timeout=5))[0]
    last_renewal = emu.lease_writes[-1].at
    async with task(b.acquire()) as standby:
        await eventually(standby.done, what="the standby to take the Lease", timeout=10)
    taken = emu.lease_writes[-1]
    assert taken.holder == "b" and b.leading
    waited = taken.at - last_renewal
    assert DURATION <= waited <= DURATION + RETRY + 0.5, waited


async def test_a_leader_that_cannot_renew_stops_before_the_standby_takes_over(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. a leads and renews 2. its renewals start failing (500), b stands by. Result: a's validity
    ends (``keep`` raises LeadershipLost) no later than the renew deadline after its last renewal,
    and strictly before b's takeover lands: never two holders at once."""
    emu, _ = cluster
    a, b = electors("a"), electors("b")
    assert (await a.try_acquire(timeout=5))[0]
    lost_at: list[float] = []
    overlap: list[str] = []

    def on_write(write: Any) -> None:
        if write.holder == "b" and a.leading:
            overlap.append(f"b took the Lease while a was still valid for {a.valid_until - a.monotonic():.3f}s")

    emu.on_lease_write = on_write
    async with task(a.keep()) as keeper, task(b.acquire()) as standby:
        await eventually(lambda: len(emu.lease_writes) >= 3, what="a few renewals", timeout=5)
        emu.fail_when(
            lambda r: r.method == "PUT" and ((r.data or {}).get("spec") or {}).get("holderIdentity") == "a",
            500,
            "InternalError",
            "etcdserver: request timed out",
        )
        last_renewal = emu.lease_writes[-1].at
        with pytest.raises(leader.LeadershipLost):
            await asyncio.wait_for(keeper, timeout=5)
        lost_at.append(time.time())
        await eventually(standby.done, what="the standby to take the Lease", timeout=10)
    assert not overlap, overlap
    assert lost_at[0] - last_renewal <= RENEW + RETRY, lost_at[0] - last_renewal
    assert holder(emu) == "b"


async def test_a_hung_renewal_is_bounded_by_the_deadline(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. a leads 2. its renewals hang (no answer at all). Result: ``keep`` gives up by the renew
    deadline, not when the request would have timed out by itself."""
    emu, _ = cluster
    a = electors("a")
    assert (await a.try_acquire(timeout=5))[0]
    hang = asyncio.Event()

    async def hung(_: Any) -> None:
        await hang.wait()

    emu[kmock.method.GET, kmock.resource(LEASES)] << hung
    started = time.monotonic()
    try:
        with pytest.raises(leader.LeadershipLost):
            await asyncio.wait_for(a.keep(), timeout=5)
    finally:
        hang.set()
    assert time.monotonic() - started <= RENEW + 0.2


async def test_release_lets_the_standby_take_over_at_once(
    cluster: tuple[ClusterEmulator, kmock.Server], electors: Callable[..., leader.Elector]
) -> None:
    """1. a leads, b stands by and has seen a's renewal 2. a releases. Result: b holds the Lease
    within a retry period or so, far sooner than the lease duration; a no longer counts as leading."""
    emu, _ = cluster
    a, b = electors("a"), electors("b", retry_period=0.1)
    assert (await a.try_acquire(timeout=5))[0]
    async with task(b.acquire()) as standby:
        await eventually(lambda: b._seen is not None, what="b to see a's Lease", timeout=5)
        released = time.monotonic()
        await a.release()
        assert not a.leading and holder(emu) in ("", "b")
        await eventually(standby.done, what="the standby to take the released Lease", timeout=5)
    assert time.monotonic() - released < DURATION / 2
    assert holder(emu) == "b"


def test_the_watchdog_fires_at_the_deadline_while_the_event_loop_is_blocked() -> None:
    """1. an elector valid for 0.2 s more 2. this thread blocks (as a handler blocking the event loop
    would) until the watchdog fires. Result: it fires at the deadline, give or take its poll; and
    not at all while renewals keep moving the deadline."""
    fired = threading.Event()
    at: list[float] = []
    clock = time.monotonic
    elector = types.SimpleNamespace(valid_until=clock() + 0.2, monotonic=clock)
    dog = leader.Watchdog(elector, lambda: (at.append(clock()), fired.set()), poll=0.02)  # type: ignore[arg-type]
    started = clock()
    dog.start()
    assert fired.wait(timeout=5)
    dog.stop()
    assert 0.2 <= at[0] - started <= 0.2 + 0.2, at[0] - started
    renewed = types.SimpleNamespace(valid_until=clock() + 0.3, monotonic=clock)
    quiet = threading.Event()
    dog = leader.Watchdog(renewed, quiet.set, poll=0.02)  # type: ignore[arg-type]
    dog.start()
    deadline = clock() + 1.0
    while clock() < deadline:
        renewed.valid_until = clock() + 0.3
        assert not quiet.wait(timeout=0.05), "fired although renewed"
    dog.stop()


async def test_the_emulators_put_replaces_and_needs_the_update_verb(
    cluster: tuple[ClusterEmulator, kmock.Server],
) -> None:
    """PUT as on a real API server: the body replaces the object (a field left out is gone), the
    server's metadata stays, a status subresource's status is kept, a spec change bumps
    ``generation``; in RBAC mode it needs ``update``, which ``patch`` does not grant."""
    emu, server = cluster
    emu.write_audit = None  # the test's own PUTs pose as the controller's: not the controller's writes
    created = await emu.put(
        "apps/v1/deployments",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": {"a": "1"}},
            "spec": {"replicas": 1, "paused": True},
            "status": {"replicas": 1},
        },
    )
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/llama"
    body = {
        "metadata": {"name": "llama", "resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"replicas": 2},
    }
    response = await server.client.put(path, json={**body, "status": {"replicas": 9}})
    assert response.status == 200
    now = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert now is not None
    assert now["spec"] == {"replicas": 2} and "labels" not in now["metadata"]
    assert now["status"] == {"replicas": 1}, "status is the subresource's"
    assert now["metadata"]["uid"] == created["metadata"]["uid"] and now["metadata"]["generation"] == 2
    emu.rbac = [(("apps",), ("deployments",), ("get", "patch"))]
    kopf = {"User-Agent": "kopf/1.45.2"}
    denied = await server.client.put(path, json={"metadata": {"name": "llama"}, "spec": {}}, headers=kopf)
    assert denied.status == 403 and 'cannot update resource "deployments"' in (await denied.json())["message"]
    emu.rbac = [(("apps",), ("deployments",), ("get", "update"))]
    allowed = await server.client.put(path, json={"metadata": {"name": "llama"}, "spec": {}}, headers=kopf)
    assert allowed.status == 200
