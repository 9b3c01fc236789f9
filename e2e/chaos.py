"""Faults during rolling restarts, behind a real balancer, with three views of every request reconciled.

A :class:`Fleet` is what a Deployment of model pods looks like on this machine: ``pods`` pairs of a
``drain-router-dev fake-model`` and a ``drain-router serve`` in front of it (one model server per router,
as in a pod), a real HAProxy or Envoy health-checking every router's ``/readyz``, streaming clients
through the balancer and, beside them, :data:`SESSION_CLIENTS` realtime (WebSocket) session clients
that hold ``/v1/realtime`` sessions for the whole run, each reconnecting at once when its session
ends, and :data:`GRPC_CLIENTS` gRPC clients calling vLLM's ``Generate`` through the balancer's gRPC
side to every router's gRPC listener (``--grpc-port``, relaying to its model server's gRPC port).
:meth:`Fleet.cycle` restarts every pod once, one at a time, injecting one fault
(:data:`FAULTS`) into one random pod's restart. :meth:`Fleet.finish` stops the clients, collects the
views (what the stream clients saw, how every session ended and when, each router lifetime's
``requests_total{outcome}`` scraped before it exited, each model lifetime's ``/stats``) and
reconciles them (``e2e/reconcile.py``). A gRPC call is a request in every view, as a stream is:
the clients' calls by outcome beside their streams, the routers' ``grpc_requests_total{outcome}``
beside their ``requests_total`` (the outcome names are shared, and a router's in-flight count holds
both), the model servers' gRPC counters (``completed`` as finished) beside their stream counters. Used by ``e2e/test_faults.py`` (a few cycles in CI) and
``e2e/soak.py`` (``make soak``, hundreds).

Sessions and the drain: a session never ends on its own, so a router SIGTERMed with sessions open
closes with them in flight and sends them Close 1001 at its in-flight deadline (t0 + 3 s), counting
each ``deadline_aborted``, and exits 1; the clients reconnect through the balancer to another
router. A router SIGKILL or a model crash cuts its pod's sessions (the clients see 1006): each such
fault opens a window (:class:`reconcile.FaultWindow`) that explains its pod's cut sessions and the
handshakes that failed meanwhile; any other unclean end is unexplained and fails the run.

How the router view is taken: after SIGTERM and once the balancer has marked the router down,
nothing new reaches it, so a ``/metrics`` scrape (one consistent snapshot) that shows it draining or
closing with nothing in flight is its final count; one that shows it closing with only WebSocket
sessions in flight is its final count but for those sessions, which its deadline ends (its
``drain.deadline`` log line must say it aborted as many). A router that exits between two scrapes
with requests still in flight leaves those ``unresolved`` (said in the reconciliation, never hidden).
Everything runs on 127.0.0.1; every wait polls with a deadline.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
import random
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from drain_router_dev import cluster, grpc_load, load, realtime, sessions, streams
from drain_router_dev.process import Process, wait_until
from e2e import balancers, reconcile

DRAIN_SECS = 1
"""Five probe intervals: the balancer has long taken the router out when it closes."""
GRACE_SECS = 5
"""Declared on every router: the deadline is t0 + 3 s, which only a stalled upstream reaches."""
DEADLINE_SECS = GRACE_SECS - 2
PROBE_MS = 200
CLIENTS = 8
CHUNKS = 8
INTERVAL_MS = 30
LEAVE_FRACTION = 0.3
"""In the client-abort fault, the share of requests whose client leaves at a random chunk."""
SLOW_CLIENTS = 2
SLOW_CHUNKS = 40
SLOW_READ_DELAY_SECS = 0.03
"""A slow reader: 256-byte reads 30 ms apart, about 1.5 s per 40-chunk stream (inside the deadline)."""
KILL_WINDOW_SLACK_SECS = 0.05
"""A lost request belongs to a SIGKILL when it ended after the kill and was sent before the
balancer was seen marking the router down (plus this much: the balancer decides a moment before
its admin answer shows it). Sent, not ended: Envoy closes a cut client connection only after its
``delayed_close_timeout`` (1 s), so the client sees a killed stream end a second later."""
WAIT_SECS = 15.0
LIFETIME_START = "startup.listening"
"""The log line every router lifetime writes (the log holds every lifetime; ``drain.start`` is
missing without a drain window)."""
SESSION_CLIENTS = 2
"""Realtime sessions held open through the balancer for the whole run, beside the streams."""
SESSION_DELTAS = 10
SESSION_INTERVAL_MS = 30
"""One response in a session: 10 deltas 30 ms apart; a session asks for one after another."""
SESSION_RESPONSES = 12
"""A session's client closes it with 1000 after this many responses (about 3.5 s) and opens the
next: sessions spread over the pods (a session that only ended at a restart would settle on the
soak's steady pod for good), and clients close sessions while routers drain."""
GRPC_CLIENTS = 4
"""gRPC clients calling ``Generate`` (``CHUNKS`` tokens, paced like the streams) back to back beside them."""


@dataclasses.dataclass(slots=True)
class Pod:
    model: cluster.FakeModel
    replica: cluster.Replica


@dataclasses.dataclass(slots=True)
class Ledger:
    """The router and model views, accumulated over every process lifetime that ended."""

    router: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    killed_inflight: int = 0
    unresolved: int = 0
    kill_window: int = 0
    model: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    crashed_active: int = 0
    crash_window: int = 0
    kill_windows: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    fault_windows: list[reconcile.FaultWindow] = dataclasses.field(default_factory=list)
    """Where a router SIGKILL, a model crash or a stall may end sessions unclean, on which pod."""
    sessions_open: int = 0
    """Realtime sessions the model servers still held at their last read (0 once the clients closed)."""
    problems: list[str] = dataclasses.field(default_factory=list)
    """Expectations of a fault that did not hold (exit codes, readiness, the expedite)."""

    def add_model(self, stats: dict[str, Any]) -> None:
        """A model lifetime's last ``/stats``: its stream and gRPC call counters (realtime sessions
        are not among them: the fake model counts those apart, as ``sessions*``). A gRPC call that
        ended otherwise than completed or cancelled (aborted, failed) is in none, so the model's books
        will not balance: none should."""
        calls = stats["grpc"]
        self.model["started"] += stats["started"] + calls["started"]
        self.model["finished"] += stats["finished"] + calls["completed"]
        self.model["cancelled"] += stats["cancelled"] + calls["cancelled"]


@dataclasses.dataclass(frozen=True, slots=True)
class CycleRow:
    """One cycle's line of the loss table: what the clients saw of requests that ended in it."""

    cycle: int
    balancer: str
    drain_secs: int
    fault: str
    target: str
    requests: int
    ok: int
    left: int
    lost: int
    lost_kinds: dict[str, int]
    seconds: float
    sessions: reconcile.SessionView = reconcile.SessionView()
    """The realtime sessions that ended in the cycle, and the faults that explain their unclean ends."""
    grpc_calls: int = 0
    grpc_lost: int = 0
    """The gRPC calls that ended in the cycle, and how many of them were lost."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """A router's resident memory and open descriptors at one moment."""

    t: float
    router: str
    pid: int
    rss: int
    fds: int


class Fleet:
    """Pods behind one balancer, streaming clients, and the ledger of everything that ended."""

    def __init__(
        self,
        workdir: Path,
        balancer: str,
        session: aiohttp.ClientSession,
        register: Callable[[Process], None],
        *,
        pods: int = 2,
        steady: int = 0,
        drain_secs: int = DRAIN_SECS,
        seed: int | None = None,
        session_clients: int = SESSION_CLIENTS,
    ) -> None:
        """``steady`` more pods take traffic but are never restarted (the soak watches their RSS and
        descriptors over the whole run); ``register`` receives every process for cleanup.
        ``session_clients`` 0: no realtime sessions (each would be held to its router's deadline)."""
        self.workdir = workdir
        self.kind = balancer
        self.session = session
        self.register = register
        self.drain_secs = drain_secs
        self.rng = random.Random(seed)
        logs = workdir / "logs"
        self.pods: list[Pod] = []
        for i in range(pods + steady):
            model = cluster.FakeModel(logs, name=f"model-{i}", chunks=CHUNKS, interval_ms=INTERVAL_MS, grpc=True)
            replica = cluster.Replica(
                f"router-{i}",
                model.url,
                logs,
                shutdown_drain_secs=drain_secs,
                termination_grace_secs=GRACE_SECS,
                grpc_upstream=model.grpc_url,
                # The faults' expectations are written for realtime sessions closed at the deadline
                # (a stalled model server leaves them quiet, which `idle` would close sooner and
                # count completed); the idle mode has its own tests.
                extra_args=("--websocket-close-at", "deadline"),
            )
            self.pods.append(Pod(model, replica))
        self.rolled = self.pods[:pods]
        self.lb = balancers.make(
            balancer,
            workdir / balancer,
            [(p.replica.name, p.replica.port) for p in self.pods],
            inter_ms=PROBE_MS,
            grpc_servers=[(p.replica.name, p.replica.grpc_port or 0, p.replica.admin_port) for p in self.pods],
        )
        self.load = load.Load(
            self.lb.url, clients=CLIENTS, chunks=CHUNKS, interval_ms=INTERVAL_MS, seed=self.rng.randrange(2**32)
        )
        self.slow_loads: list[load.Load] = []
        self.grpc = grpc_load.GrpcLoad(
            self.lb.grpc_target, clients=GRPC_CLIENTS, tokens=CHUNKS, seed=self.rng.randrange(2**32)
        )
        self.realtime = realtime.Sessions(
            self.lb.url,
            clients=session_clients,
            deltas=SESSION_DELTAS,
            interval_ms=SESSION_INTERVAL_MS,
            max_responses=SESSION_RESPONSES,
        )
        self.ledger = Ledger()
        self.rows: list[CycleRow] = []
        self.result: reconcile.Reconciliation | None = None
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()

    # -- setup and teardown ---------------------------------------------------------------------

    async def start(self) -> None:
        self.t0 = time.monotonic()
        for pod in self.pods:
            self.register(pod.model.process)
            self.register(pod.replica.process)
            await pod.model.start(self.session)
            await pod.replica.start(self.session)
        self.register(self.lb.process)
        await self.lb.start()
        for pod in self.pods:
            await self.lb.wait_status(pod.replica.name, "UP")
        await self.load.start()
        await self.realtime.start()
        await self.grpc.start()

    async def finish(self) -> reconcile.Reconciliation:
        """Stop the clients (each session closes with 1000 once its response is whole), take every
        living process's final count, and reconcile the views."""
        await self.load.stop()
        await self.realtime.stop()
        await self.grpc.stop()
        records = self.records
        for pod in self.pods:
            scrape = await self._wait_scrape(pod.replica, lambda s: s.inflight == 0, "idle")
            self.ledger.router.update(scrape.every_outcome)
            stats = await self._wait_model_idle(pod.model)
            self.ledger.add_model(stats)
            self.ledger.sessions_open += stats["sessions"]
        return reconcile.reconcile(
            self.client_view(records, self.grpc.records),
            self.router_view(),
            self.model_view(),
            self.session_view(self.realtime.records),
        )

    def session_view(self, records: list[realtime.Record]) -> reconcile.SessionView:
        return reconcile.session_view((session_end(r) for r in records), self.ledger.fault_windows)

    def unexplained_sessions(self) -> list[str]:
        """The sessions that ended unclean with no fault window to explain them, one line each."""
        lines = []
        for record in self.realtime.records:
            end = session_end(record)
            if end.end in (reconcile.NORMAL, reconcile.GOING_AWAY):
                continue
            if any(w.explains(end) for w in self.ledger.fault_windows):
                continue
            result = record.result
            lines.append(
                f"{record.end.value}: handshake {result.handshake_status}, close {result.close_code}, "
                f"error {result.error}, problem {result.problem}, server {record.server}, "
                f"{record.started - self.t0:.2f}-{record.finished - self.t0:.2f}s into the run"
            )
        return lines

    @property
    def records(self) -> list[load.Record]:
        return self.load.records + [r for slow in self.slow_loads for r in slow.records]

    def client_view(
        self,
        records: list[load.Record],
        grpc_records: Sequence[grpc_load.Record] = (),
    ) -> reconcile.ClientView:
        """The streams' and the gRPC calls' outcomes (both name theirs ``ok`` and ``left``)."""

        def after_kill(r: load.Record | grpc_load.Record) -> bool:
            return any(r.finished >= kill and r.started <= down for kill, down in self.ledger.kill_windows)

        every = [*records, *grpc_records]
        counts = collections.Counter(r.outcome.value for r in every)
        lost = [r for r in every if r.outcome.lost]
        return reconcile.ClientView(
            ok=counts[streams.Outcome.OK.value],
            left=counts[streams.Outcome.LEFT.value],
            lost=len(lost),
            lost_after_kill=sum(1 for r in lost if after_kill(r)),
        )

    def router_view(self) -> reconcile.RouterView:
        c = self.ledger.router
        return reconcile.RouterView(
            completed=c["completed"],
            client_aborted=c["client_aborted"],
            upstream_error=c["upstream_error"],
            deadline_aborted=c["deadline_aborted"],
            rejected=c["rejected"],
            killed_inflight=self.ledger.killed_inflight,
            unresolved=self.ledger.unresolved,
            kill_window=self.ledger.kill_window,
        )

    def model_view(self) -> reconcile.ModelView:
        c = self.ledger.model
        return reconcile.ModelView(
            started=c["started"],
            finished=c["finished"],
            cancelled=c["cancelled"],
            crashed_active=self.ledger.crashed_active,
            crash_window=self.ledger.crash_window,
            sessions_open=self.ledger.sessions_open,
        )

    # -- one cycle --------------------------------------------------------------------------------

    async def cycle(self, number: int, fault: str) -> CycleRow:
        """Restart every rolled pod once, one at a time; ``fault`` strikes one of them, at random."""
        started = time.monotonic()
        target = self.rng.choice(self.rolled)
        inject = FAULTS[fault]
        for pod in self.rolled:
            if pod is target:
                await inject(self, pod)
            else:
                await self.restart(pod)
        self.sample_resources()
        now = time.monotonic()
        ended = [r for r in self.records if started <= r.finished < now]
        calls = [r for r in self.grpc.records if started <= r.finished < now]
        counts = collections.Counter(r.outcome for r in ended)
        lost = {o.value: n for o, n in counts.items() if o.lost}
        row = CycleRow(
            cycle=number,
            balancer=self.kind,
            drain_secs=self.drain_secs,
            fault=fault,
            target=target.replica.name,
            requests=len(ended),
            ok=counts[streams.Outcome.OK],
            left=counts[streams.Outcome.LEFT],
            lost=sum(lost.values()),
            lost_kinds=lost,
            seconds=time.monotonic() - started,
            sessions=self.session_view([r for r in self.realtime.records if started <= r.finished < now]),
            grpc_calls=len(calls),
            grpc_lost=sum(1 for r in calls if r.outcome.lost),
        )
        self.rows.append(row)
        return row

    def sample_resources(self) -> None:
        now = time.monotonic()
        for pod in self.pods:
            pid = pod.replica.process.pid
            if pid is None or not pod.replica.process.alive:
                continue
            try:
                proc = psutil.Process(pid)
                self.samples.append(Sample(now, pod.replica.name, pid, proc.memory_info().rss, proc.num_fds()))
            except psutil.Error:
                continue

    # -- the pieces of a restart ------------------------------------------------------------------

    async def restart(self, pod: Pod, *, second_sigterm: bool = False) -> None:
        """SIGTERM, the final scrape, exit 0, start again, seen UP by the balancer."""
        await self.stop_router(pod, second_sigterm=second_sigterm)
        await self.start_router(pod)

    async def stop_router(self, pod: Pod, *, second_sigterm: bool = False) -> float:
        """SIGTERM ``pod``'s router and count its lifetime; returns seconds from SIGTERM to exit.

        It exits 0, or 1 when realtime sessions were still in flight at its deadline: those get
        Close 1001 there and count ``deadline_aborted`` (its ``drain.deadline`` line says how many);
        the others of the sessions it closed with ended before, closed by their clients (1000,
        ``completed``)."""
        replica = pod.replica
        # Without a drain window an idle router exits within milliseconds of SIGTERM, before any scrape:
        # then this one, taken just before, is its last count (what ended in between is unresolved).
        before = await replica.metrics(self.session)
        t0 = time.monotonic()
        replica.sigterm()
        if self.drain_secs:
            await self.lb.wait_status(replica.name, "DOWN")
        if second_sigterm:
            replica.sigterm()
        scrape = await self._final_scrape(replica, before)
        code = await replica.process.wait_exit(timeout=GRACE_SECS + WAIT_SECS)
        took = time.monotonic() - t0
        held = _sessions_only(scrape)
        aborted = _log_field(replica.process.log_path, "drain.deadline", "aborted", since=LIFETIME_START) or 0
        expect_exit = 1 if held and aborted else 0
        if code != expect_exit:
            self.ledger.problems.append(
                f"{replica.name} exited {code}, expected {expect_exit} "
                f"({held} sessions held at closing, {aborted} aborted at the deadline)"
            )
        self.ledger.router.update(scrape.every_outcome)
        if held:
            if aborted > held:
                self.ledger.problems.append(
                    f"{replica.name}: {held} sessions in flight at closing, but drain.deadline says {aborted} aborted"
                )
            self.ledger.router["deadline_aborted"] += aborted
            self.ledger.router["completed"] += max(0, held - aborted)
        else:
            self.ledger.unresolved += scrape.inflight
        return took

    async def start_router(self, pod: Pod) -> None:
        await pod.replica.start(self.session)
        await self.lb.wait_status(pod.replica.name, "UP")

    async def _final_scrape(self, replica: cluster.Replica, last: cluster.Scrape) -> cluster.Scrape:
        """Scrape until the router is draining or closing with nothing in flight (its final count),
        or closing with only WebSocket sessions in flight (its final count but for those, which the
        deadline ends), or until it is gone; the last scrape taken (``last`` if none succeeded)."""
        box = [last]

        async def final() -> bool:
            try:
                box[0] = await replica.metrics(self.session, timeout=1.0)
            except (TimeoutError, aiohttp.ClientError, OSError):
                return not replica.process.alive  # gone: the last scrape taken is its final count
            return (box[0].state in ("draining", "closing") and box[0].inflight == 0) or _sessions_only(box[0])

        with contextlib.suppress(TimeoutError):  # the last scrape taken, whatever it says
            await wait_until(final, GRACE_SECS + WAIT_SECS, f"{replica.name}'s final count")
        return box[0]

    async def _wait_scrape(
        self, replica: cluster.Replica, done: Callable[[cluster.Scrape], bool], what: str
    ) -> cluster.Scrape:
        async def scrape() -> cluster.Scrape | None:
            try:
                return await replica.metrics(self.session)
            except (TimeoutError, aiohttp.ClientError, OSError):
                if not replica.process.alive:
                    raise replica.process.failed(f"exited while waiting for it to be {what}") from None
                return None

        found = await wait_until(scrape, WAIT_SECS, f"{replica.name} {what}", until=lambda s: s is not None and done(s))
        assert found is not None
        return found

    async def _wait_model_idle(self, model: cluster.FakeModel) -> dict[str, Any]:
        return await wait_until(
            lambda: model.stats(self.session),
            WAIT_SECS,
            f"{model.name} to have no stream, session or gRPC call open",
            until=lambda stats: stats["active"] == 0 and stats["sessions"] == 0 and stats["grpc"]["active"] == 0,
        )

    async def _wait_ready(self, replica: cluster.Replica, status: int, body_status: str) -> None:
        async def reached() -> bool:
            try:
                code, body = await replica.readyz(self.session)
            except (TimeoutError, aiohttp.ClientError, OSError):
                if not replica.process.alive:
                    raise replica.process.failed(f"exited before /readyz said {status}") from None
                return False  # not listening yet
            return code == status and isinstance(body, dict) and body.get("status") == body_status

        await wait_until(reached, timeout=WAIT_SECS, what=f"{replica.name} /readyz {status} {body_status}")


# -- the faults: each restarts its pod in its own way ----------------------------------------------


async def no_fault(fleet: Fleet, pod: Pod) -> None:
    """Expected: nothing lost; exit 0. A plain rolling restart: SIGTERM, drain, exit, start again."""
    await fleet.restart(pod)


async def model_crash(fleet: Fleet, pod: Pod) -> None:
    """Expected: the crashed model server's in-flight streams fail, each counted by its router as
    ``upstream_error``, and so do the requests the router takes before its upstream health check
    sees the crash; nothing else is lost. The router's /readyz follows the upstream health check
    (503 ``upstream_unavailable``, so the balancer takes it out; 200 again once the model is back).

    1. read the router's count and the model's /stats 2. SIGKILL the model server 3. the router
    says upstream_unavailable, the balancer marks it down, its in-flight count drains to 0
    4. restart the model server on the same port 5. the router is ready, the balancer has it UP
    6. the pod's rolling restart as usual.

    Its realtime sessions are cut: the router counts each ``upstream_error`` and closes the client's
    connection without a Close frame (1006); handshakes it takes before the balancer marks it down
    fail (its 502, ``upstream_error``). Both are the crash's, in its window."""
    replica, model = pod.replica, pod.model
    before = await replica.metrics(fleet.session)
    stats = await model.stats(fleet.session)
    pid = model.process.pid
    t_crash = time.monotonic()
    model.process.kill()
    fleet.ledger.add_model(stats)
    fleet.ledger.crashed_active += stats["active"] + stats["grpc"]["active"]
    await fleet._wait_ready(replica, 503, "upstream_unavailable")
    await fleet.lb.wait_status(replica.name, "DOWN")
    fleet.ledger.fault_windows.append(
        reconcile.FaultWindow(
            fault=reconcile.MODEL_CRASH, start=t_crash, end=time.monotonic() + KILL_WINDOW_SLACK_SECS, server=pid
        )
    )
    after = await fleet._wait_scrape(replica, lambda s: s.inflight == 0, "with nothing in flight after the crash")
    # Streams the router completed around the crash: the model may have finished them after its read.
    fleet.ledger.crash_window += after.every_outcome.get("completed", 0) - before.every_outcome.get("completed", 0)
    await model.start(fleet.session)
    await fleet._wait_ready(replica, 200, "ready")
    await fleet.lb.wait_status(replica.name, "UP")
    await fleet.restart(pod)


async def router_kill(fleet: Fleet, pod: Pod) -> None:
    """Expected: the router's in-flight streams are lost, as many as its /admin/inflight said just
    before the SIGKILL, plus the requests the balancer sends to the dead address before its next
    probe marks it down (a SIGKILL gives no drain); nothing after that, nothing on other pods.

    1. read the model's /stats, the router's /metrics and /admin/inflight 2. SIGKILL the router's
    process group 3. the balancer marks it down 4. the model server has cancelled the dead router's
    streams 5. start the router again, seen UP.

    Its realtime sessions die with it (in its /admin/inflight; the clients see 1006), and handshakes
    sent to it before the balancer marks it down fail: both are the kill's, in its window."""
    replica, model = pod.replica, pod.model
    m0 = await model.stats(fleet.session)
    scrape = await replica.metrics(fleet.session)
    inflight = (await replica.inflight(fleet.session))["inflight"]
    t_kill = time.monotonic()
    replica.process.kill()
    await fleet.lb.wait_status(replica.name, "DOWN")
    t_down = time.monotonic()
    m1 = await fleet._wait_model_idle(model)
    fleet.ledger.router.update(scrape.every_outcome)
    fleet.ledger.killed_inflight += inflight
    fleet.ledger.kill_window += sum(b - a for a, b in zip(_started_finished(m0), _started_finished(m1)))
    fleet.ledger.kill_windows.append((t_kill, t_down + KILL_WINDOW_SLACK_SECS))
    fleet.ledger.fault_windows.append(
        reconcile.FaultWindow(
            fault=reconcile.ROUTER_KILL, start=t_kill, end=t_down + KILL_WINDOW_SLACK_SECS, server=model.process.pid
        )
    )
    await fleet.start_router(pod)


async def stall_past_deadline(fleet: Fleet, pod: Pod) -> None:
    """Expected: the streams stuck on the stalled model server are aborted at the deadline
    (t0 + grace - 2 s, the grace declared), counted as ``deadline_aborted`` (as many as the router's
    ``drain.deadline`` log line says it aborted), and the router exits 1; nothing else is lost. Its
    realtime sessions get Close 1001 at the same deadline (``deadline_aborted`` too).

    1. SIGSTOP the model server (it stalls: no byte, no close) 2. SIGTERM the router 3. the balancer
    marks it down; the router closes with its stuck streams in flight 4. the deadline aborts them,
    exit 1 5. SIGCONT the model server 6. start the router again.

    A realtime handshake the router forwards to the frozen model server before the balancer marks
    it down never gets its 101: the deadline aborts it too (the client's handshake fails), in the
    stall's window."""
    replica, model = pod.replica, pod.model
    t_stop = time.monotonic()
    model.process.signal(signal.SIGSTOP)
    try:
        replica.sigterm()
        await fleet.lb.wait_status(replica.name, "DOWN")
        fleet.ledger.fault_windows.append(
            reconcile.FaultWindow(
                fault=reconcile.STALL,
                start=t_stop,
                end=time.monotonic() + KILL_WINDOW_SLACK_SECS,
                server=model.process.pid,
            )
        )
        # Closing: the listener is shut, the model frozen; the in-flight count can no longer move.
        stuck = await fleet._wait_scrape(replica, lambda s: s.state == "closing", "closing")
        code = await replica.process.wait_exit(timeout=GRACE_SECS + WAIT_SECS)
    finally:
        model.process.signal(signal.SIGCONT)
    if code != 1:
        fleet.ledger.problems.append(f"{replica.name} exited {code} after the deadline, expected 1")
    aborted = _log_field(replica.process.log_path, "drain.deadline", "aborted", since=LIFETIME_START)
    if aborted != stuck.inflight:
        fleet.ledger.problems.append(
            f"{replica.name}: {stuck.inflight} stuck in flight at closing, but drain.deadline says {aborted} aborted"
        )
    fleet.ledger.router.update(stuck.every_outcome)
    fleet.ledger.router["deadline_aborted"] += stuck.inflight
    await fleet.start_router(pod)


async def second_sigterm(fleet: Fleet, pod: Pod) -> None:
    """Expected: nothing lost, exit 0 (1 with realtime sessions open: they wait for the deadline's
    1001), and closing sooner than the drain window: a second SIGTERM while draining ends the
    window early, and in-flight streams still finish.

    1. SIGTERM 2. the balancer marks it down 3. SIGTERM again 4. closing before t0 + drain (by the
    router's own ``drain.start`` and ``drain.closing`` log lines), exit."""
    await fleet.stop_router(pod, second_sigterm=True)
    took = _log_seconds(pod.replica.process.log_path, "drain.start", "drain.closing")
    if fleet.drain_secs and (took is None or took >= fleet.drain_secs):
        fleet.ledger.problems.append(
            f"{pod.replica.name}: the second SIGTERM did not expedite "
            f"({took}s from drain.start to drain.closing, drain window {fleet.drain_secs}s)"
        )
    closing_signal = _log_field(pod.replica.process.log_path, "drain.closing", "signal")
    if fleet.drain_secs and closing_signal != "sigterm":
        fleet.ledger.problems.append(
            f"{pod.replica.name}: closing came from {closing_signal!r}, not the second SIGTERM"
        )
    await fleet.start_router(pod)


async def sigterm_during_startup(fleet: Fleet, pod: Pod) -> None:
    """Expected: nothing lost; the router SIGTERMed while still starting exits 0 at once, and the
    balancer never sends it a request.

    1. the pod's router drains and exits as usual 2. its model server is frozen (SIGSTOP), so the
    next router stays ``starting`` (its upstream health check cannot pass) 3. start the router; its
    /readyz says 503 ``starting`` 4. SIGTERM: exit 0 5. SIGCONT the model server, start the router."""
    replica, model = pod.replica, pod.model
    await fleet.stop_router(pod)
    model.process.signal(signal.SIGSTOP)
    try:
        replica.process.start()
        await fleet._wait_ready(replica, 503, "starting")
        replica.sigterm()
        code = await replica.process.wait_exit(timeout=WAIT_SECS)
    finally:
        model.process.signal(signal.SIGCONT)
    if code != 0:
        fleet.ledger.problems.append(f"{replica.name}: SIGTERM during startup exited {code}, expected 0")
    await fleet.start_router(pod)


async def clients_leave(fleet: Fleet, pod: Pod) -> None:
    """Expected: nothing lost; the streams and gRPC calls whose clients leave at random points are
    counted ``client_aborted`` by the routers and cancelled by the model servers, one for one.

    1. 30 % of requests and calls now leave after a random number of chunks or tokens 2. the pod's
    rolling restart 3. clients stop leaving."""
    fleet.load.leave_fraction = fleet.grpc.leave_fraction = LEAVE_FRACTION
    try:
        await fleet.restart(pod)
    finally:
        fleet.load.leave_fraction = fleet.grpc.leave_fraction = 0.0


async def slow_reader(fleet: Fleet, pod: Pod) -> None:
    """Expected: nothing lost; streams read slowly (256-byte reads, 30 ms apart, about 1.5 s each)
    through a restart all arrive whole, and the router still exits 0.

    1. two slow-reading clients join 2. the pod's rolling restart 3. they finish their streams."""
    slow = load.Load(
        fleet.lb.url,
        clients=SLOW_CLIENTS,
        chunks=SLOW_CHUNKS,
        interval_ms=5,
        read_delay_secs=SLOW_READ_DELAY_SECS,
        seed=fleet.rng.randrange(2**32),
    )
    fleet.slow_loads.append(slow)
    await slow.start()
    try:
        await fleet.restart(pod)
    finally:
        await slow.stop()


FAULTS: dict[str, Callable[[Fleet, Pod], Awaitable[None]]] = {
    "none": no_fault,
    "model_crash": model_crash,
    "router_kill": router_kill,
    "stall_past_deadline": stall_past_deadline,
    "second_sigterm": second_sigterm,
    "sigterm_during_startup": sigterm_during_startup,
    "clients_leave": clients_leave,
    "slow_reader": slow_reader,
}


def _started_finished(stats: dict[str, Any]) -> tuple[int, int]:
    """A model's ``/stats``: the streams and gRPC calls it started, and those it finished."""
    return stats["started"] + stats["grpc"]["started"], stats["finished"] + stats["grpc"]["completed"]


def _sessions_only(scrape: cluster.Scrape) -> int:
    """The WebSocket sessions a closing router holds for its deadline, when they are all it still
    has in flight (0 otherwise)."""
    if scrape.state == "closing" and scrape.inflight and scrape.inflight == scrape.sessions:
        return scrape.sessions
    return 0


def session_end(record: realtime.Record) -> reconcile.SessionEnd:
    """A realtime client's record as the reconciliation takes it."""
    if record.end is sessions.End.NORMAL:
        end = reconcile.NORMAL
    elif record.end is sessions.End.GOING_AWAY:
        end = reconcile.GOING_AWAY
    elif record.result.handshake_status != sessions.SWITCHING_PROTOCOLS:
        end = reconcile.FAILED
    else:
        end = reconcile.CUT
    server = record.server if isinstance(record.server, int) else None
    return reconcile.SessionEnd(end=end, started=record.started, finished=record.finished, server=server)


def _log_seconds(path: Path, first: str, then: str) -> float | None:
    """Seconds between the ``timestamp`` of the last ``first`` and the last ``then`` log lines."""
    a, b = _log_field(path, first, "timestamp"), _log_field(path, then, "timestamp")
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    return (datetime.datetime.fromisoformat(b) - datetime.datetime.fromisoformat(a)).total_seconds()


def _log_field(path: Path, event: str, field: str, *, since: str | None = None) -> Any:
    """``field`` of the last JSON log line with ``event`` in a router's log (None if there is none);
    with ``since``, only after the last line with that event (the log holds every lifetime)."""
    value = None
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line and (since is None or f'"{since}"' not in line):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == since:
            value = None
        if entry.get("event") == event:
            value = entry.get(field)
    return value


def format_sessions(view: reconcile.SessionView) -> str:
    """E.g. ``sessions 14: 1000 x3, 1001 x9, unclean 2 (router_kill 2)``."""
    parts = [f"1000 x{view.normal}", f"1001 x{view.going_away}", f"unclean {view.unclean}"]
    causes = [f"{k} {n}" for k, n in view.explained.items()]
    if view.unexplained:
        causes.append(f"unexplained {view.unexplained}")
    return f"sessions {view.sessions}: " + ", ".join(parts) + (f" ({', '.join(causes)})" if causes else "")


def format_row(row: CycleRow) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(row.lost_kinds.items()))
    return (
        f"{row.cycle:>4}  {row.balancer:<7} drain {row.drain_secs}s  {row.fault:<22} {row.target:<9} "
        f"{row.requests:>5} req {row.ok:>5} ok {row.left:>3} left {row.lost:>3} lost"
        + (f" ({kinds})" if kinds else "")
        + f"; {format_sessions(row.sessions)}; gRPC {row.grpc_calls} calls, {row.grpc_lost} lost"
        + f"  {row.seconds:.1f}s"
    )


def format_reconciliation(result: reconcile.Reconciliation) -> str:
    explained = ", ".join(f"{k} {n}" for k, n in result.explained.items()) or "none"
    handshakes = result.sessions.handshakes_failed
    among = f" ({handshakes} of them failed session handshakes)" if handshakes else ""
    lines = [
        f"{result.requests} requests, {result.lost} lost{among}: explained {explained}; "
        f"unaccounted {result.unaccounted}",
        f"  {format_sessions(result.sessions)}",
    ]
    lines += [f"  mismatch: {m}" for m in result.mismatches]
    return "\n".join(lines)
