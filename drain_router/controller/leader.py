"""Leader election on a ``coordination.k8s.io/v1`` Lease: of several replicas, only the holder acts.

The algorithm is client-go's (``tools/leaderelection``), written out because kubernetes_asyncio's
``leaderelection`` package does not bound what a partitioned leader does: its renew loop checks its
deadline only between API calls that have no timeout (a hung renewal keeps the leader acting past the
Lease's expiry), it measures with the wall clock, and it cannot release the Lease on shutdown.

- Every write is a PUT carrying the ``resourceVersion`` it read: of two replicas racing for the Lease,
  the API server lets one win and answers the other 409 Conflict.
- A standby takes the Lease only when it is free (no ``holderIdentity``: released) or when the same
  record (the same ``resourceVersion``) has been in place for the record's ``leaseDurationSeconds``,
  counted on this process's monotonic clock from the moment it first saw that record. No two
  clocks' readings are ever compared, so skew between machines does not matter; only their rates do.
- A leader counts its validity from the moment it *sent* its last successful renewal: it is valid
  until ``sent + renew_deadline``. A standby cannot see that renewal before it was sent, so it cannot
  take the Lease before ``sent + lease_duration``. ``renew_deadline < lease_duration`` leaves the
  difference as margin (a request already sent landing, clock rates).
- Every renewal is bounded by the time left until the deadline, and :class:`Watchdog`, a thread that
  does not need the event loop, ends the process when the deadline passes without a renewal.

Pure decisions (:func:`may_take`, :func:`taken_spec`) are separate from the calls that feed them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from drain_router.decisions import durations

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

#: What an election call can fail with (each is a failed try, never a crash).
FAILURES = (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError)


class LeadershipLost(Exception):
    """This replica no longer holds the Lease (another took it, or the renew deadline passed)."""


def may_take(
    spec: Mapping[str, Any], *, identity: str, seen_for: float | None, default_duration: float
) -> tuple[bool, float]:
    """May ``identity`` write itself into a Lease with this ``spec``, the record unchanged for
    ``seen_for`` seconds of this process's clock (``None``: a record not seen before)? Returns
    (yes or no, seconds until it may at the earliest). Purely computational, no side effects.

    Yes when the Lease is free (no holder: released or new), held by ``identity`` itself, or when
    its holder has not renewed it for its ``leaseDurationSeconds`` (``default_duration`` when the
    record names none)."""
    holder = spec.get("holderIdentity") or ""
    if not holder or holder == identity:
        return True, 0.0
    duration = float(spec.get("leaseDurationSeconds") or default_duration)
    remaining = duration - (seen_for or 0.0)
    return remaining <= 0, max(remaining, 0.0)


def taken_spec(spec: Mapping[str, Any], *, identity: str, duration: int, now: float) -> dict[str, Any]:
    """The spec that makes ``identity`` the holder at wall time ``now`` (a renewal keeps
    ``acquireTime``; a takeover counts one more ``leaseTransitions``). Purely computational."""
    renewing = spec.get("holderIdentity") == identity
    stamp = durations.format_micro_time(now)
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        **spec,
        "holderIdentity": identity,
        "leaseDurationSeconds": duration,
        "acquireTime": spec.get("acquireTime") if renewing and spec.get("acquireTime") else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions if renewing or not spec.get("holderIdentity") else transitions + 1,
    }


@dataclasses.dataclass(kw_only=True)
class Elector:
    """One replica's side of the election: :meth:`acquire` (standby until it holds the Lease),
    :meth:`keep` (renew until lost), :meth:`release` (on a graceful stop)."""

    api: client.ApiClient
    namespace: str
    name: str
    identity: str
    lease_duration: int
    """Seconds; written into the Lease as ``leaseDurationSeconds``."""
    renew_deadline: float
    retry_period: float
    log: Any
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    valid_until: float = -math.inf
    """Monotonic time until which this replica may act; ``-inf`` while it does not hold the Lease."""
    _seen: tuple[str, float] | None = None
    """(resourceVersion, monotonic time first seen) of the record last read with another holder."""
    _holder: str | None = None

    @property
    def leading(self) -> bool:
        return self.monotonic() < self.valid_until

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Try every retry period (sooner when the holder's lease is about to run out) until this
        replica holds the Lease (True) or ``stop`` is set (False)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            wait = self.retry_period
            try:
                taken, until = await self.try_acquire(timeout=self.retry_period)
            except FAILURES as exc:
                self.log.warning("leader.lease_unreachable", lease=self.name, error=describe(exc))
                taken, until = False, self.retry_period
            if taken:
                return True
            wait = min(self.retry_period, until) if until > 0 else self.retry_period
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.01))
            except TimeoutError:
                pass
        return False

    async def try_acquire(self, *, timeout: float) -> tuple[bool, float]:
        """One read and, when allowed, one conditional write. Returns (holds the Lease now, seconds
        until a takeover may be possible)."""
        sent = self.monotonic()
        lease = await self._get(timeout=timeout)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": taken_spec({}, identity=self.identity, duration=self.lease_duration, now=self.wall()),
            }
            if not await self._write("POST", LEASES.format(namespace=self.namespace), body, sent, timeout):
                return False, self.retry_period
            self.log.info("leader.acquired", lease=self.name, namespace=self.namespace, identity=self.identity)
            return True, 0.0
        spec = lease.get("spec") or {}
        version = lease["metadata"]["resourceVersion"]
        holder = spec.get("holderIdentity") or ""
        if holder != self._holder:
            self._holder = holder
            if holder and holder != self.identity:
                self.log.info("leader.standby", lease=self.name, holder=holder, identity=self.identity)
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, self.monotonic())
        allowed, until = may_take(
            spec,
            identity=self.identity,
            seen_for=self.monotonic() - self._seen[1],
            default_duration=self.lease_duration,
        )
        if not allowed:
            return False, until
        renewing = holder == self.identity
        body = {
            **lease,
            "spec": taken_spec(spec, identity=self.identity, duration=self.lease_duration, now=self.wall()),
        }
        if not await self._write("PUT", self._path(), body, sent, timeout):
            return False, self.retry_period
        if not renewing:
            self.log.info(
                "leader.acquired", lease=self.name, namespace=self.namespace, identity=self.identity, previous=holder
            )
        return True, 0.0

    async def keep(self) -> None:
        """Renew every retry period until the Lease is lost; then raise :class:`LeadershipLost`.
        Each try is bounded by the time left, so this returns by the renew deadline at the latest."""
        while True:
            left = self.valid_until - self.monotonic()
            if left <= 0:
                self.valid_until = -math.inf
                raise LeadershipLost(f"not renewed within the renew deadline ({self.renew_deadline:g}s)")
            await asyncio.sleep(min(self.retry_period, left))
            left = self.valid_until - self.monotonic()
            if left <= 0:
                continue
            try:
                renewed, _ = await asyncio.wait_for(self.try_acquire(timeout=left), timeout=left)
            except FAILURES as exc:
                self.log.warning("leader.renew_failed", lease=self.name, error=describe(exc))
                continue
            if not renewed and self._holder and self._holder != self.identity:
                self.valid_until = -math.inf
                raise LeadershipLost(f"the Lease is held by {self._holder}")

    async def release(self) -> None:
        """Give the Lease up (holder cleared), so a standby takes over on its next look instead of
        waiting out the lease duration. Only while still valid: a lease already expired may be
        someone else's by now. Best effort; a failure only means the standby waits."""
        left = self.valid_until - self.monotonic()
        if left <= 0:
            return
        self.valid_until = -math.inf
        try:
            lease = await self._get(timeout=left)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            spec["renewTime"] = durations.format_micro_time(self.wall())
            await self._call("PUT", self._path(), body={**lease, "spec": spec}, timeout=left)
            self.log.info("leader.released", lease=self.name, identity=self.identity)
        except FAILURES as exc:
            self.log.warning("leader.release_failed", lease=self.name, error=describe(exc))

    def _path(self) -> str:
        return f"{LEASES.format(namespace=self.namespace)}/{self.name}"

    async def _get(self, *, timeout: float) -> dict[str, Any] | None:
        try:
            return dict(await self._call("GET", self._path(), timeout=timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _write(self, method: str, path: str, body: dict[str, Any], sent: float, timeout: float) -> bool:
        """A conditional write: True when it landed (valid until ``sent`` + the renew deadline),
        False when another replica's write got there first (409)."""
        try:
            await self._call(method, path, body=body, timeout=timeout)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self.valid_until = sent + self.renew_deadline
        return True

    async def _call(self, method: str, path: str, *, body: Any = None, timeout: float) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return await self.api.call_api(
            path,
            method,
            header_params=headers,
            body=body,
            response_types_map={200: "object", 201: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=max(timeout, 0.001),
        )


def describe(exc: BaseException) -> str:
    """An election call's failure in one line: the API server's ``Status`` message when it sent one."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {message or exc.reason}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Watchdog:
    """A thread that calls ``expired`` once the elector's validity has passed, whatever the event
    loop is doing (a handler that blocks it cannot keep a deposed leader acting)."""

    def __init__(self, elector: Elector, expired: Callable[[], None], *, poll: float = 0.05) -> None:
        self.elector, self.expired, self.poll = elector, expired, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            left = self.elector.valid_until - self.elector.monotonic()
            if left <= 0:
                self.expired()
                return
            self._stop.wait(min(left, self.poll))
