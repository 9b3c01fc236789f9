"""What every workload of the bench measures with: the plan (how much load, for how long), the
harness (the upstream, the targets, one measured cell), and what a workload declares of itself
(:class:`Workload`, :class:`Session`). The workloads are listed in run order by
:mod:`bench.workloads`; :mod:`bench.runner` runs them."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import loadgen, procstat, targets
from drain_router_dev import process as process_

MIB = 2**20


@dataclass(frozen=True)
class Plan:
    """How much load, for how long. ``seconds`` is each measurement window."""

    mode: str
    rounds: int
    seconds: float
    small_connections: int = 64
    burst_concurrency: int = 16
    burst_chunks: int = 64
    paced_concurrency: tuple[int, ...] = (16, 256, 1000)
    paced_chunks: int = 32
    paced_interval_ms: float = 30.0
    upload_connections: int = 8
    upload_bytes: int = MIB
    hold_steps: tuple[int, ...] = (1000, 10000)
    drain_streams: int = 16
    drain_chunks: int = 64
    drain_interval_ms: float = 30.0
    #: The router's --shutdown-drain-secs for the drain workload; streams outlast it, so they end
    #: in closing, which is what the exit timing is about.
    drain_window_secs: int = 1
    #: Which targets get the drain workload (None: every one with a graceful-stop signal).
    drain_targets: tuple[str, ...] | None = None
    #: Use wrk (when installed) for plain request/response load; the aiohttp client otherwise.
    use_wrk: bool = True
    #: Pause before each RSS reading of the idle-hold workload, for the target to settle.
    hold_settle_secs: float = 0.5
    #: WebSocket echo: sessions in a closed loop, and each message's size.
    ws_sessions: int = 16
    ws_message_bytes: int = 128
    #: Idle WebSocket sessions held open for the RSS-per-session figure.
    ws_hold_sessions: int = 5000
    #: gRPC streamed tokens: concurrent Generate calls on one connection, tokens per call (unpaced).
    grpc_streams: int = 8
    grpc_messages: int = 20_000
    #: gRPC unary Echo calls: connections, calls at a time on each, and the request's payload.
    grpc_unary_connections: int = 8
    grpc_unary_streams: int = 8
    grpc_body_bytes: int = 128
    #: Idle open gRPC calls held for the RSS-per-stream figure: how many, how many to a client
    #: connection (the router allows 100 at a time on one), one token every this many ms.
    grpc_hold_streams: int = 5000
    grpc_hold_per_connection: int = 100
    grpc_hold_interval_ms: int = 60_000
    #: The tracing workload's paced streams (bench/tracing_overhead.py): one concurrency, to keep it short.
    tracing_paced_concurrency: int = 256
    #: The activator workload (bench/activator_cost.py): requests held at once, by the activator for
    #: a sleeping service and by the router in its admission queue (the activator's default --queue-size).
    activator_held: int = 1000

    @property
    def paced_stream_secs(self) -> float:
        return self.paced_chunks * self.paced_interval_ms / 1000


PLANS = {
    "full": Plan("full", rounds=3, seconds=3.0),
    "quick": Plan("quick", rounds=2, seconds=1.5, hold_steps=(1000, 5000), grpc_messages=5_000),
    "smoke": Plan(
        "smoke",
        rounds=1,
        seconds=0.25,
        small_connections=4,
        burst_concurrency=2,
        burst_chunks=8,
        paced_concurrency=(4,),
        paced_chunks=4,
        paced_interval_ms=20,
        upload_connections=2,
        upload_bytes=64 * 1024,
        hold_steps=(20,),
        drain_streams=2,
        drain_chunks=10,
        drain_interval_ms=20,
        drain_window_secs=0,
        drain_targets=("router",),
        use_wrk=False,
        hold_settle_secs=0.1,
        ws_sessions=2,
        ws_hold_sessions=20,
        grpc_streams=2,
        grpc_messages=200,
        grpc_unary_connections=1,
        grpc_unary_streams=2,
        grpc_hold_streams=20,
        grpc_hold_per_connection=10,
        tracing_paced_concurrency=4,
        activator_held=20,
    ),
}


def plan_for(mode: str, rounds: int | None = None, seconds: float | None = None) -> Plan:
    plan = PLANS[mode]
    if rounds:
        plan = replace(plan, rounds=rounds)
    if seconds:
        plan = replace(plan, seconds=seconds)
    return plan


# -- machine --------------------------------------------------------------------------------------


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(load generator cores, server cores): the last core for the load generator, the rest for the
    servers; no pinning on a one-core machine."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# -- one measurement ------------------------------------------------------------------------------


class Harness:
    """The bench upstream, the targets named for the run, and the records: what a workload measures
    against, and how it measures one cell (:meth:`measure`)."""

    def __init__(self, plan: Plan, names: list[str], log: Callable[[str], None]) -> None:
        self.plan = plan
        self.log = log
        self.names = names
        self.loadgen_cpus, self.server_cpus = split_cpus()
        self.fd_limit = raise_fd_limit()
        self.workdir = Path(tempfile.mkdtemp(prefix="drain-router-bench-"))
        self.upstream: process_.Process | None = None
        self.upstream_port = 0
        self.grpc_upstream_port: int | None = None
        self.targets: list[targets.Target] = []
        self.info: dict[str, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []
        # A proxied stream needs two descriptors in the proxy; keep the largest step inside the limit.
        self.max_held = (self.fd_limit - 200) // 2
        self.t0 = time.perf_counter()

    @property
    def ctx(self) -> targets.Context:
        return targets.Context(self.workdir, self.upstream_port, self.server_cpus, self.grpc_upstream_port)

    def start_upstream(self, grpc: bool = False) -> None:
        """The bench upstream; with ``grpc``, its gRPC port too (the targets then open theirs)."""
        self.upstream_port = process_.free_port()
        grpc_args: list[str] = []
        if grpc:
            self.grpc_upstream_port = process_.free_port()
            grpc_args = ["--grpc-port", str(self.grpc_upstream_port)]
        self.upstream = process_.Process(
            "upstream",
            [sys.executable, "-m", "bench.upstream", "--port", str(self.upstream_port), *grpc_args],
            self.workdir / "upstream.log",
            cwd=Path(__file__).parent.parent,
            preexec_fn=targets.pin_to(self.server_cpus),
        )
        self.upstream.start()
        targets.wait_ready(self.upstream, f"http://127.0.0.1:{self.upstream_port}/small")
        if self.grpc_upstream_port:
            targets.wait_listening(self.upstream, self.grpc_upstream_port)

    def start_targets(self) -> None:
        for target in targets.all_targets():
            if target.name not in self.names:
                continue
            reason = target.missing()
            entry: dict[str, Any] = {"label": target.label, "available": reason is None, "reason": reason}
            if reason is None:
                try:
                    entry["version"] = target.version()
                    target.start(self.ctx)
                    self.targets.append(target)
                except Exception as exc:
                    entry.update(available=False, reason=f"failed to start: {exc}")
                    target.stop()
            self.info[target.name] = entry
            self.log(
                f"target {target.name}: {'ok ' + entry.get('version', '') if entry['available'] else entry['reason']}"
            )

    def stop_all(self) -> None:
        for target in self.targets:
            target.stop()
        if self.upstream is not None:
            self.upstream.stop(signal.SIGTERM, timeout=5)

    async def measure(
        self,
        round_no: int,
        workload: str,
        target: targets.Target,
        units_key: str | None,
        run: Callable[[], Awaitable[dict[str, Any]]],
    ) -> None:
        """Run one workload against one target, with the target's and the upstream's CPU around it."""
        meter = procstat.Meter(target.pid)
        up_meter = procstat.Meter(self.upstream.pid if self.upstream else None)
        meter.start()
        up_meter.start()
        wall0 = time.perf_counter()
        try:
            metrics = await run()
        except Exception as exc:
            metrics = {"failed": f"{type(exc).__name__}: {exc}"}
        wall = time.perf_counter() - wall0
        cpu = meter.stop()  # None when the process exited meanwhile (the drain)
        alive = target.pid is not None and cpu is not None
        metrics["target_core"] = cpu / wall if alive else None
        metrics["upstream_core"] = (up_meter.stop() or 0.0) / wall
        if units_key and alive and metrics.get(units_key):
            metrics["target_cpu_us_per_unit"] = cpu / metrics[units_key] * 1e6
        metrics["target_rss_kib"] = meter.rss() if alive else None
        self.records.append({"round": round_no, "workload": workload, "target": target.name, "metrics": metrics})
        self.log(
            f"  {time.perf_counter() - self.t0:6.1f}s r{round_no} {workload:<16} {target.name:<8} {_brief(metrics)}"
        )

    def skip(self, round_no: int, workload: str, target: targets.Target, reason: str) -> None:
        """Record a skipped cell, and say so."""
        self.records.append(
            {"round": round_no, "workload": workload, "target": target.name, "metrics": {"skipped": reason}}
        )
        self.log(
            f"  {time.perf_counter() - self.t0:6.1f}s r{round_no} {workload:<16} {target.name:<8} skipped: {reason}"
        )

    # -- the loads more than one workload drives --------------------------------------------------

    async def small_get(
        self, target: targets.Target, *, headers: dict[str, str] | None = None, seconds: float | None = None
    ) -> dict[str, Any]:
        url = target.url + "/small"
        window = self.plan.seconds if seconds is None else seconds
        if self.plan.use_wrk and loadgen.wrk_available():
            return await asyncio.to_thread(
                loadgen.wrk, url, self.plan.small_connections, window, cpus=self.loadgen_cpus, headers=headers
            )
        return await loadgen.requests(url, self.plan.small_connections, window, headers=headers)

    async def sse(
        self,
        target: targets.Target,
        concurrency: int,
        chunks: int,
        interval_ms: float,
        *,
        oneread: bool = False,
        body: bytes | None = None,
    ) -> dict[str, Any]:
        """Streams of ``chunks`` events ``interval_ms`` apart (0: back to back), each a ``GET``, or a
        ``POST`` of ``body``; ``oneread``: each stream in one upstream write."""
        url = (
            f"{target.url}/v1/completions?chunks={chunks}&interval_ms={interval_ms:g}{'&oneread=1' if oneread else ''}"
        )
        stream_secs = chunks * interval_ms / 1000
        # Spread client starts over one stream length (at least a little), so 1000 streams do not
        # arrive in one burst; the window opens once every client has started.
        stagger = min(max(stream_secs, 0.05), 1.0)
        return await loadgen.sse(
            url,
            concurrency,
            self.plan.seconds,
            expected_events=chunks + 1,
            stagger=stagger,
            warmup=stagger + min(0.2, self.plan.seconds / 4),
            stream_seconds=stream_secs,
            body=body,
        )


def fresh_rss(target: targets.Target) -> Callable[[], int]:
    return lambda: procstat.rss_kib(procstat.tree(target.pid)) if target.pid else 0


def _brief(metrics: dict[str, Any]) -> str:
    if "failed" in metrics:
        return "FAILED " + metrics["failed"]
    keys = [
        "rate",
        "streams_per_s",
        "events_per_s",
        "mib_per_s",
        "ttfb_p50_ms",
        "gap_p99_ms",
        "lat_p99_ms",
        "messages_per_s",
        "rtt_p99_ms",
        "kib_per_session",
        "kib_per_stream",
        "readyz_503_ms",
        "exit_after_last_stream_ms",
        "errors",
        "loadgen_core",
        "target_core",
    ]
    parts = [f"{k}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), (int, float))]
    if "steps" in metrics:
        parts += [f"held{s['held']}={s['kib_per_stream']:.1f}KiB" for s in metrics["steps"] if s["kib_per_stream"]]
    return " ".join(parts)


# -- what a workload declares ---------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """Workloads selected by one name (``--workloads grpc``) and shown as one set of rows: the report
    takes a group's records from one run."""

    name: str
    #: How the report's header names the group's rows ("for the gRPC rows").
    label: str


class Session:
    """A workload's part in one run. The runner calls every selected workload's session in run order
    at each step: ``start`` before the rounds, ``round`` in each round, ``finish`` after the last
    round, ``after`` once every session finished (a pass of its own, with its own processes), and
    ``stop`` at the end, after a failure too. Each step does nothing unless the workload says."""

    def __init__(self, bench: Harness) -> None:
        self.bench = bench

    async def start(self) -> None:
        return None

    async def round(self, round_no: int) -> None:
        return None

    async def finish(self) -> None:
        return None

    async def after(self) -> None:
        return None

    async def stop(self) -> None:
        return None


#: A workload's cells of one round: ``cells(bench, name, round_no)``, ``name`` the workload's.
RoundCells = Callable[[Harness, str, int], Awaitable[None]]


@dataclass(frozen=True)
class Workload:
    """One workload, declared once by the module that measures it: its ``--workloads`` name, its
    group, what it does (its cells of each round, or a :class:`Session` for a workload with steps
    before or after the rounds) and what it needs started for it."""

    name: str
    group: Group
    #: Its cells of each round; or ``session``, one of the two.
    each_round: RoundCells | None = None
    session: Callable[[Harness], Session] | None = None
    #: Its records are named ``<name>_<something>`` (``sse_paced_16``, ``tracing_totals``), not
    #: ``<name>``.
    suffixed: bool = False
    #: The names of its records in a run of a plan, when it knows them beforehand and they are not
    #: just ``[name]``: ``records(name, plan)``.
    records: Callable[[str, Plan], list[str]] | None = None
    #: What it needs started before the rounds: the bench upstream (with its gRPC port), and the
    #: targets named for the run (a workload that starts its own has neither, or only the upstream).
    needs_upstream: bool = True
    needs_grpc_upstream: bool = False
    needs_targets: bool = True

    def __post_init__(self) -> None:
        if (self.each_round is None) == (self.session is None):
            raise ValueError(f"workload {self.name!r}: give each_round or session, one of the two")

    def open(self, bench: Harness) -> Session:
        """Its session for a run on ``bench``."""
        if self.session is not None:
            return self.session(bench)
        return _EachRound(bench, self)

    def makes(self, record: str) -> bool:
        """Whether a record named ``record`` (a results file's ``workload``) is one of its."""
        return record.startswith(self.name + "_") if self.suffixed else record == self.name

    def record_names(self, plan: Plan) -> list[str]:
        return self.records(self.name, plan) if self.records is not None else [self.name]


class _EachRound(Session):
    def __init__(self, bench: Harness, workload: Workload) -> None:
        super().__init__(bench)
        self.workload = workload

    async def round(self, round_no: int) -> None:
        assert self.workload.each_round is not None
        await self.workload.each_round(self.bench, self.workload.name, round_no)
