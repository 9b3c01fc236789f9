"""The interleaved run: every workload against every target, round after round (A B C A B C ...),
so that drift on a shared machine hits every target alike; then the results file."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench import activator_cost, grpcload, loadgen, overload, procstat, targets, tracing_overhead
from drain_router_dev import process as process_

RESULTS_DIR = Path(__file__).parent / "results"
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

#: Every workload, in run order (``sse_paced`` is one per concurrency of the plan).
WORKLOADS = (
    "small_get",
    "sse_burst",
    "sse_oneread",
    "sse_paced",
    "upload_1mib",
    "idle_hold",
    "ws_echo",
    "ws_idle_hold",
    "grpc_stream",
    "grpc_unary",
    "grpc_idle_hold",
    "drain",
    "overload",
    "tracing",
    "activator",
)
#: Names that select several workloads at once (``--workloads grpc``).
WORKLOAD_GROUPS = {
    "http": ("small_get", "sse_burst", "sse_oneread", "sse_paced", "upload_1mib", "idle_hold", "drain"),
    "ws": ("ws_echo", "ws_idle_hold"),
    "grpc": ("grpc_stream", "grpc_unary", "grpc_idle_hold"),
    # The fake engine under 2x and 4x its capacity behind each bound (bench/overload.py): its own
    # processes, after the rounds.
    "overload": ("overload",),
    # The router with --tracing off, at ratio 0 and at ratio 1, exporting to the bench's own OTLP
    # sink (bench/tracing_overhead.py): small GET and paced streams, its own routers.
    "tracing": ("tracing",),
    # drain-router activator against the router: CPU per relayed small GET, RSS and CPU per held
    # request (bench/activator_cost.py): its own processes and stand-in Kubernetes API.
    "activator": ("activator",),
}
GRPC_WORKLOADS = WORKLOAD_GROUPS["grpc"]


def select_workloads(spec: str | None) -> tuple[str, ...]:
    """``--workloads``: comma-separated workloads or groups; every workload when empty. Raises
    ``ValueError`` naming an unknown one."""
    if not spec:
        return WORKLOADS
    wanted: set[str] = set()
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        if name not in WORKLOADS and name not in WORKLOAD_GROUPS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join((*WORKLOADS, *WORKLOAD_GROUPS))}")
        wanted.update(WORKLOAD_GROUPS.get(name, (name,)))
    return tuple(w for w in WORKLOADS if w in wanted)


def workload_names(plan: Plan, selected: tuple[str, ...] = WORKLOADS) -> list[str]:
    """The workload names of the records a run of ``selected`` makes."""
    return [
        name
        for workload in selected
        for name in ([f"sse_paced_{c}" for c in plan.paced_concurrency] if workload == "sse_paced" else [workload])
    ]


# -- machine --------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _machine_busy_seconds() -> float:
    return procstat.machine_busy_seconds()


def _own_cpu_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    live = procstat.cpu_seconds([p for p in procstat.tree(os.getpid()) if p != os.getpid()])
    return sum(u.ru_utime + u.ru_stime for u in usage) + live


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


class Bench:
    def __init__(
        self,
        plan: Plan,
        names: list[str],
        log: Callable[[str], None],
        workloads: tuple[str, ...] = WORKLOADS,
    ) -> None:
        self.plan = plan
        self.log = log
        self.names = names
        self.workloads = workloads
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

    @property
    def grpc(self) -> bool:
        return any(w in GRPC_WORKLOADS for w in self.workloads)

    def start_upstream(self) -> None:
        self.upstream_port = process_.free_port()
        grpc_args: list[str] = []
        if self.grpc:
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

    # -- workloads --------------------------------------------------------------------------------

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

    async def upload(self, target: targets.Target) -> dict[str, Any]:
        url = target.url + "/upload"
        size = self.plan.upload_bytes
        if self.plan.use_wrk and loadgen.wrk_available():
            return await asyncio.to_thread(
                loadgen.wrk,
                url,
                self.plan.upload_connections,
                self.plan.seconds,
                upload_bytes=size,
                cpus=self.loadgen_cpus,
            )
        return await loadgen.requests(url, self.plan.upload_connections, self.plan.seconds, upload_bytes=size)

    async def sse(
        self, target: targets.Target, concurrency: int, chunks: int, interval_ms: float, *, oneread: bool = False
    ) -> dict[str, Any]:
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
        )

    async def hold(self, target: targets.Target, round_no: int) -> None:
        """Fresh instance per round, so the per-stream figure is not flattered by memory a previous
        workload left allocated."""
        fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
        steps = [min(step, self.max_held) for step in self.plan.hold_steps]
        fresh.start(self.ctx, instance=f"-hold-r{round_no}")
        try:
            url = fresh.url + "/v1/completions?hold=1"
            await self.measure(
                round_no,
                "idle_hold",
                fresh,
                None,
                lambda: loadgen.hold(url, steps, fresh_rss(fresh), settle=self.plan.hold_settle_secs),
            )
        finally:
            fresh.stop()

    # -- WebSocket --------------------------------------------------------------------------------

    def ws_url(self, target: targets.Target) -> str:
        return target.url.replace("http://", "ws://", 1) + "/v1/realtime"

    async def ws_skip(self, round_no: int, workload: str, target: targets.Target) -> bool:
        """Record a skipped cell (and say so) when ``target`` does not forward the WebSocket upgrade."""
        status = await loadgen.ws_handshake(self.ws_url(target))
        if status == 101:
            return False
        reason = f"answers the WebSocket upgrade with {status}" if status else "no answer to the WebSocket upgrade"
        self.records.append(
            {"round": round_no, "workload": workload, "target": target.name, "metrics": {"skipped": reason}}
        )
        self.log(
            f"  {time.perf_counter() - self.t0:6.1f}s r{round_no} {workload:<16} {target.name:<8} skipped: {reason}"
        )
        return True

    async def ws_echo(self, target: targets.Target, round_no: int) -> None:
        if await self.ws_skip(round_no, "ws_echo", target):
            return
        plan = self.plan
        await self.measure(
            round_no,
            "ws_echo",
            target,
            "messages_total",
            lambda: loadgen.ws_echo(
                self.ws_url(target),
                plan.ws_sessions,
                plan.seconds,
                message_bytes=plan.ws_message_bytes,
                warmup=min(0.2, plan.seconds / 4),
            ),
        )

    async def ws_hold(self, target: targets.Target, round_no: int) -> None:
        """A fresh instance per round, as for held streams."""
        fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
        fresh.start(self.ctx, instance=f"-ws-hold-r{round_no}")
        try:
            if await self.ws_skip(round_no, "ws_idle_hold", fresh):
                return
            count = min(self.plan.ws_hold_sessions, self.max_held)
            await self.measure(
                round_no,
                "ws_idle_hold",
                fresh,
                None,
                lambda: loadgen.ws_hold(self.ws_url(fresh), count, fresh_rss(fresh), settle=self.plan.hold_settle_secs),
            )
        finally:
            fresh.stop()

    # -- gRPC -------------------------------------------------------------------------------------

    async def grpc_skip(self, round_no: int, workload: str, target: targets.Target) -> bool:
        """Record a skipped cell (and say so) when an Echo call through ``target``'s gRPC port fails."""
        reason = await grpcload.probe("127.0.0.1", target.grpc_port)
        if reason is None:
            return False
        self.records.append(
            {"round": round_no, "workload": workload, "target": target.name, "metrics": {"skipped": reason}}
        )
        self.log(
            f"  {time.perf_counter() - self.t0:6.1f}s r{round_no} {workload:<16} {target.name:<8} skipped: {reason}"
        )
        return True

    async def grpc_stream(self, target: targets.Target, round_no: int) -> None:
        if await self.grpc_skip(round_no, "grpc_stream", target):
            return
        plan = self.plan
        await self.measure(
            round_no,
            "grpc_stream",
            target,
            "messages_total",
            lambda: grpcload.stream(
                "127.0.0.1",
                target.grpc_port,
                plan.grpc_streams,
                plan.seconds,
                messages=plan.grpc_messages,
                warmup=min(0.3, plan.seconds / 4),
            ),
        )

    async def grpc_unary(self, target: targets.Target, round_no: int) -> None:
        if await self.grpc_skip(round_no, "grpc_unary", target):
            return
        plan = self.plan

        async def run() -> dict[str, Any]:
            if plan.use_wrk and grpcload.h2load_available():
                return await asyncio.to_thread(
                    grpcload.h2load,
                    f"http://127.0.0.1:{target.grpc_port}",
                    plan.grpc_unary_connections,
                    plan.grpc_unary_streams,
                    plan.seconds,
                    body_bytes=plan.grpc_body_bytes,
                    cpus=self.loadgen_cpus,
                )
            return await grpcload.unary(
                "127.0.0.1",
                target.grpc_port,
                plan.grpc_unary_connections,
                plan.grpc_unary_streams,
                plan.seconds,
                body_bytes=plan.grpc_body_bytes,
                warmup=min(0.2, plan.seconds / 4),
            )

        await self.measure(round_no, "grpc_unary", target, "requests", run)

    async def grpc_hold(self, target: targets.Target, round_no: int) -> None:
        """A fresh instance per round, as for held streams."""
        fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
        fresh.start(self.ctx, instance=f"-grpc-hold-r{round_no}")
        try:
            if await self.grpc_skip(round_no, "grpc_idle_hold", fresh):
                return
            plan = self.plan
            count = min(plan.grpc_hold_streams, self.max_held)
            await self.measure(
                round_no,
                "grpc_idle_hold",
                fresh,
                None,
                lambda: grpcload.hold(
                    "127.0.0.1",
                    fresh.grpc_port,
                    count,
                    fresh_rss(fresh),
                    per_connection=plan.grpc_hold_per_connection,
                    interval_ms=plan.grpc_hold_interval_ms,
                    settle=plan.hold_settle_secs,
                ),
            )
        finally:
            fresh.stop()

    async def drain(self, target: targets.Target, round_no: int) -> None:
        fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
        if fresh.name == "router":
            fresh.extra_args = ["--shutdown-drain-secs", str(self.plan.drain_window_secs)]
        fresh.start(self.ctx, instance=f"-drain-r{round_no}")
        try:
            await self.measure(round_no, "drain", fresh, None, lambda: self._drain(fresh))
        finally:
            fresh.stop()

    async def _drain(self, target: targets.Target) -> dict[str, Any]:
        """1. N paced streams open 2. poll readiness 3. drain signal at t0 4. readiness 503 at t1
        5. every stream runs to its end 6. the process exits. Result: t1 - t0 and exit - last end."""
        plan = self.plan
        proc = target.proc
        assert proc is not None and target.drain_signal is not None
        exited: dict[str, Any] = {}

        def wait_exit() -> None:
            exited["rc"] = proc.wait()
            exited["at"] = time.perf_counter()

        watcher = threading.Thread(target=wait_exit, daemon=True)
        watcher.start()
        url = f"{target.url}/v1/completions?chunks={plan.drain_chunks}&interval_ms={plan.drain_interval_ms:g}"
        opened = 0
        all_open = asyncio.Event()
        sent_at: float | None = None
        not_ready_at: float | None = None

        async def stream(http: Any) -> tuple[float, int]:
            nonlocal opened
            events = 0
            async with http.get(url) as resp:
                async for data in resp.content.iter_any():
                    if not events:
                        opened += 1
                        if opened == plan.drain_streams:
                            all_open.set()
                    events += data.count(b"\n\n")
            return time.perf_counter(), events

        async def poll(ready_url: str) -> None:
            nonlocal not_ready_at
            async with loadgen.session() as probe:
                while True:
                    try:
                        async with probe.get(ready_url) as resp:
                            await resp.read()
                            status: int | None = resp.status
                    except (OSError, aiohttp.ClientError):
                        status = None
                    if sent_at is not None and status != 200:
                        not_ready_at = time.perf_counter()
                        return
                    await asyncio.sleep(0.001)

        ready_url = target.readiness_url()
        async with loadgen.session() as http:
            tasks = [asyncio.ensure_future(stream(http)) for _ in range(plan.drain_streams)]
            await asyncio.wait_for(all_open.wait(), 10)
            poller = asyncio.ensure_future(poll(ready_url)) if ready_url else None
            await asyncio.sleep(0.1)
            sent_at = time.perf_counter()
            os.kill(proc.pid, target.drain_signal)
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            if poller:
                try:
                    await asyncio.wait_for(poller, 5)
                except TimeoutError:
                    pass
        finished = [o for o in outcomes if isinstance(o, tuple) and o[1] >= plan.drain_chunks + 1]
        last_end = max((o[0] for o in outcomes if isinstance(o, tuple)), default=None)
        await asyncio.to_thread(watcher.join, plan.drain_window_secs + 20)
        exit_at = exited.get("at")
        return {
            "signal": signal.Signals(target.drain_signal).name,
            "streams": plan.drain_streams,
            "streams_complete": len(finished),
            "readyz_503_ms": (not_ready_at - sent_at) * 1000 if not_ready_at and ready_url else None,
            "last_stream_end_ms": (last_end - sent_at) * 1000 if last_end else None,
            "exit_after_last_stream_ms": (exit_at - last_end) * 1000 if exit_at and last_end else None,
            "signal_to_exit_ms": (exit_at - sent_at) * 1000 if exit_at else None,
            "exit_code": exited.get("rc"),
            "errors": sum(1 for o in outcomes if isinstance(o, BaseException)),
        }

    # -- the run ----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        started = dt.datetime.now(dt.UTC)
        load_before = os.getloadavg()
        busy0, own0, wall0 = _machine_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
        if self.loadgen_cpus:
            os.sched_setaffinity(0, self.loadgen_cpus)
        selected = set(self.workloads)
        tracing = tracing_overhead.Tracing(self) if "tracing" in selected else None
        activator = activator_cost.ActivatorCost(self) if "activator" in selected else None
        if selected - {"overload"}:  # the overload measurement starts its own processes
            self.start_upstream()
        if selected - {"overload", "tracing", "activator"}:  # so do tracing (its routers, sink) and activator
            self.start_targets()
        try:
            if tracing is not None:
                tracing.start()
                await tracing.warm()
            if activator is not None:
                await activator.start()
            for target in self.targets:  # warm every connection pool and cache once
                await loadgen.requests(target.url + "/small", 4, min(0.2, plan.seconds / 2))
            for round_no in range(plan.rounds):
                self.log(f"round {round_no + 1}/{plan.rounds}")
                if "small_get" in selected:
                    for target in self.targets:
                        await self.measure(
                            round_no, "small_get", target, "requests", lambda t=target: self.small_get(t)
                        )
                if "sse_burst" in selected:
                    for target in self.targets:
                        await self.measure(
                            round_no,
                            "sse_burst",
                            target,
                            "events_total",
                            lambda t=target: self.sse(t, plan.burst_concurrency, plan.burst_chunks, 0),
                        )
                if "sse_oneread" in selected:
                    for target in self.targets:
                        await self.measure(
                            round_no,
                            "sse_oneread",
                            target,
                            "events_total",
                            lambda t=target: self.sse(t, plan.burst_concurrency, plan.burst_chunks, 0, oneread=True),
                        )
                for concurrency in plan.paced_concurrency if "sse_paced" in selected else ():
                    for target in self.targets:
                        await self.measure(
                            round_no,
                            f"sse_paced_{concurrency}",
                            target,
                            "events_total",
                            lambda t=target, c=concurrency: self.sse(t, c, plan.paced_chunks, plan.paced_interval_ms),
                        )
                if "upload_1mib" in selected:
                    for target in self.targets:
                        await self.measure(round_no, "upload_1mib", target, "requests", lambda t=target: self.upload(t))
                if "idle_hold" in selected:
                    for target in self.targets:
                        if target.name != "direct":
                            await self.hold(target, round_no)
                ws_targets = [t for t in self.targets if t.name in targets.WS_TARGETS]
                if "ws_echo" in selected:
                    for target in ws_targets:
                        await self.ws_echo(target, round_no)
                if "ws_idle_hold" in selected:
                    for target in ws_targets:
                        if target.name != "direct":
                            await self.ws_hold(target, round_no)
                grpc_targets = [t for t in self.targets if t.grpc_port and t.name in targets.GRPC_TARGETS]
                if "grpc_stream" in selected:
                    for target in grpc_targets:
                        await self.grpc_stream(target, round_no)
                if "grpc_unary" in selected:
                    for target in grpc_targets:
                        await self.grpc_unary(target, round_no)
                if "grpc_idle_hold" in selected:
                    for target in grpc_targets:
                        if target.name != "direct":
                            await self.grpc_hold(target, round_no)
                if "drain" in selected:
                    for target in self.targets:
                        wanted = plan.drain_targets is None or target.name in plan.drain_targets
                        if target.drain_signal is not None and wanted:
                            await self.drain(target, round_no)
                if tracing is not None:
                    await tracing.round(round_no)
                if activator is not None:
                    await activator.round(round_no)
            if tracing is not None:
                await tracing.finish()
            if "overload" in selected:
                self.log("overload (one pass)")
                self.records += await overload.run(overload.SETUPS[plan.mode], self.log, self.server_cpus)
        finally:
            if tracing is not None:
                tracing.stop()
            if activator is not None:
                await activator.stop()
            self.stop_all()
            if not os.environ.get("BENCH_KEEP_WORKDIR"):
                shutil.rmtree(self.workdir, ignore_errors=True)
        wall = time.perf_counter() - wall0
        busy = _machine_busy_seconds() - busy0
        own = _own_cpu_seconds() - own0
        return {
            "schema": 1,
            "mode": plan.mode,
            "started_at": started.isoformat(timespec="seconds"),
            "wall_seconds": round(wall, 1),
            "machine": {
                "cores": os.cpu_count(),
                "cpu_model": _cpu_model(),
                "kernel": platform.release(),
                "python": platform.python_version(),
                "loadgen_cpus": sorted(self.loadgen_cpus) if self.loadgen_cpus else None,
                "server_cpus": sorted(self.server_cpus) if self.server_cpus else None,
                "fd_limit": self.fd_limit,
                "loadavg_before": [round(x, 2) for x in load_before],
                # CPU used on the machine by processes outside this run, averaged over the run, in cores.
                "foreign_cores": round(max(0.0, busy - own) / wall, 3),
                "wrk": loadgen.wrk_available(),
            },
            "source": _source(),
            "workloads": list(self.workloads),
            "plan": asdict(plan) | {"hold_steps": [min(s, self.max_held) for s in plan.hold_steps]},
            "targets": self.info,
            "records": self.records,
        }


def _source() -> dict[str, Any]:
    """Which code was measured: the repository commit, whether the tree had changes, and a router
    source override if one was used."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD") or None,
        "router_dirty": bool(git("status", "--porcelain", "--", "drain_router")),
        "router_src_override": os.environ.get(targets.ROUTER_SRC_ENV),
    }


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


def plan_for(mode: str, rounds: int | None = None, seconds: float | None = None) -> Plan:
    plan = PLANS[mode]
    if rounds:
        plan = replace(plan, rounds=rounds)
    if seconds:
        plan = replace(plan, seconds=seconds)
    return plan


def _rounded(value: Any) -> Any:
    """Four significant digits are more than the noise allows; they keep the file small."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def write_results(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = results["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"{stamp}-{results['mode']}.json"
    path.write_text(json.dumps(_rounded(results), sort_keys=True, separators=(",", ":")) + "\n")
    return path
