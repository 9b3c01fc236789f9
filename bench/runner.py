"""The interleaved run: every workload against every target, round after round (A B C A B C ...),
so that drift on a shared machine hits every target alike; then the results file. The workloads and
their order come from :mod:`bench.workloads`; the runner only calls each one's steps in turn."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import harness, loadgen, procstat, targets
from bench.harness import PLANS, Plan, plan_for
from bench.workloads import BY_NAME, WORKLOAD_GROUPS, WORKLOADS, select_workloads, workload_names

#: What ``python -m bench`` and the tests take from here, some of it from where it is defined.
__all__ = [
    "PLANS",
    "RESULTS_DIR",
    "WORKLOADS",
    "WORKLOAD_GROUPS",
    "Bench",
    "Plan",
    "plan_for",
    "select_workloads",
    "workload_names",
    "write_results",
]

RESULTS_DIR = Path(__file__).parent / "results"


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


# -- the run --------------------------------------------------------------------------------------


class Bench(harness.Harness):
    """A run of ``workloads`` (names, in run order) against the targets ``names``."""

    def __init__(
        self,
        plan: Plan,
        names: list[str],
        log: Callable[[str], None],
        workloads: tuple[str, ...] = WORKLOADS,
    ) -> None:
        super().__init__(plan, names, log)
        self.workloads = workloads

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        started = dt.datetime.now(dt.UTC)
        load_before = os.getloadavg()
        busy0, own0, wall0 = _machine_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
        if self.loadgen_cpus:
            os.sched_setaffinity(0, self.loadgen_cpus)
        selected = [BY_NAME[name] for name in self.workloads]
        sessions = [workload.open(self) for workload in selected]
        # A workload that starts its own processes (overload, tracing, activator) needs less.
        if any(w.needs_upstream for w in selected):
            self.start_upstream(grpc=any(w.needs_grpc_upstream for w in selected))
        if any(w.needs_targets for w in selected):
            self.start_targets()
        try:
            for session in sessions:
                await session.start()
            for target in self.targets:  # warm every connection pool and cache once
                await loadgen.requests(target.url + "/small", 4, min(0.2, plan.seconds / 2))
            for round_no in range(plan.rounds):
                self.log(f"round {round_no + 1}/{plan.rounds}")
                if round_no:
                    # Every other round the other way round (router, before; then before, router):
                    # what the cell before leaves behind (a warm cache, a busy core) falls on each
                    # target alike, so a ratio of two targets does not carry their order.
                    self.targets.reverse()
                for session in sessions:
                    await session.round(round_no)
            for session in sessions:
                await session.finish()
            for session in sessions:
                await session.after()
        finally:
            for session in sessions:
                await session.stop()
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
