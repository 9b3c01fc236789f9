"""``make soak``: hundreds of rolling-restart cycles with random faults, behind HAProxy and Envoy.

For each balancer: a fleet of two rolled pods and one steady pod (never restarted, so its router's
memory and descriptors can be watched over the whole run) runs ``--cycles`` cycles, each restarting
both rolled pods with one random fault of ``e2e/chaos.py`` struck into one of them; then a drain-off
control fleet (``--shutdown-drain-secs 0``) runs ``--control-cycles`` plain cycles. It prints one loss
line per cycle, each run's reconciliation of the three views (clients, routers' requests_total,
model servers' /stats), the RSS and open descriptors of every router over time, and a summary table.
Realtime (WebSocket) sessions run beside the streams in every fleet (``chaos.SESSION_CLIENTS``
clients through the same balancer, reconnecting): each cycle's line and each reconciliation say how
many ended and how (``sessions 14: 1000 x3, 1001 x9, unclean 2 (router_kill 2)``), and the
sessions' share of the routers' counts is taken off before the streams' balances. gRPC clients
(``chaos.GRPC_CLIENTS``, vLLM's ``Generate`` through the balancer's gRPC side) run beside them too;
each gRPC call is a request in all three views, and each cycle's line says how many ended and were lost.

It fails (exit 1) when a drain-on run has a lost request no view accounts for, a session that did
not end with Close 1000 or 1001 and that no injected fault explains, a balance between
the views does not hold, a fault's own expectation does not hold (exit codes, readiness, the
expedite), the steady router's RSS or descriptors grow past :func:`growth_problems`' bound, or a
drain-off control loses nothing (then the harness could not see a loss).

Not part of ``make test``; ``e2e/test_faults.py`` runs one cycle of every fault per balancer in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from drain_router_dev.process import Process, ProcessFailed
from e2e import balancers, chaos

DEFAULT_CYCLES = 200
DEFAULT_CONTROL_CYCLES = 10
#: The bound on growth of the steady router, from the median of the first tenth of the samples to
#: the median of the last tenth: RSS by at most this many bytes and this fraction, descriptors by
#: at most this many (connections come and go with the traffic; a leak only grows).
RSS_GROWTH_BYTES = 10 * 2**20
RSS_GROWTH_FRACTION = 0.25
FDS_GROWTH = 16


def growth_problems(samples: list[chaos.Sample]) -> list[str]:
    """Where a long-lived router's RSS or descriptors grew past the bound. Pure."""
    if len(samples) < 10:
        return []
    tenth = max(1, len(samples) // 10)
    first, last = samples[:tenth], samples[-tenth:]
    rss0, rss1 = statistics.median(s.rss for s in first), statistics.median(s.rss for s in last)
    fds0, fds1 = statistics.median(s.fds for s in first), statistics.median(s.fds for s in last)
    problems = []
    if rss1 - rss0 > RSS_GROWTH_BYTES and rss1 > rss0 * (1 + RSS_GROWTH_FRACTION):
        problems.append(f"{samples[0].router}: RSS grew from {rss0 / 2**20:.1f} to {rss1 / 2**20:.1f} MiB")
    if fds1 - fds0 > FDS_GROWTH:
        problems.append(f"{samples[0].router}: open descriptors grew from {fds0:.0f} to {fds1:.0f}")
    return problems


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def resource_lines(samples: list[chaos.Sample]) -> list[str]:
    """Per router: RSS and descriptors, first / median / last / max over the run's samples."""
    lines = []
    for name in sorted({s.router for s in samples}):
        mine = [s for s in samples if s.router == name]
        rss = [s.rss for s in mine]
        fds = [s.fds for s in mine]
        pids = len({s.pid for s in mine})
        lines.append(
            f"  {name}: {len(mine)} samples, {pids} process(es); RSS MiB first {_mib(rss[0])} median "
            f"{_mib(statistics.median(rss))} last {_mib(rss[-1])} max {_mib(max(rss))}; fds first {fds[0]} "
            f"median {statistics.median(fds):.0f} last {fds[-1]} max {max(fds)}"
        )
    return lines


async def run(
    kind: str, drain_secs: int, cycles: int, steady: int, seed: int, workdir: Path, session: aiohttp.ClientSession
) -> tuple[chaos.Fleet, list[str]]:
    """One fleet's cycles; the fleet (rows, samples, result) and what went wrong."""
    procs: list[Process] = []
    fleet = chaos.Fleet(workdir, kind, session, procs.append, steady=steady, drain_secs=drain_secs, seed=seed)
    rng = random.Random(seed)
    failures: list[str] = []
    try:
        await fleet.start()
        fleet.sample_resources()
        for number in range(1, cycles + 1):
            fault = rng.choice(list(chaos.FAULTS)) if drain_secs else "none"
            try:
                row = await fleet.cycle(number, fault)
            except (TimeoutError, ProcessFailed, aiohttp.ClientError, OSError) as exc:
                failures.append(f"cycle {number} ({fault}) failed: {type(exc).__name__}: {exc}")
                print(f"{number:>4}  {kind:<7} drain {drain_secs}s  {fault:<22} FAILED: {exc}", flush=True)
                break
            print(chaos.format_row(row), flush=True)
        fleet.result = await fleet.finish()
    finally:
        for proc in procs:
            proc.kill()
    failures += fleet.ledger.problems
    return fleet, failures


def summary_table(results: list[tuple[str, chaos.Fleet, chaos.Fleet]]) -> list[str]:
    header = (
        "balancer",
        "cycles",
        "requests",
        "lost (drain on)",
        "unaccounted",
        "sessions",
        "1000",
        "1001",
        "unclean (explained)",
        "unexplained",
        "faults",
        "control cycles",
        "control requests",
        "lost (drain off)",
        "unaccounted (drain off)",
    )
    rows = [header]
    for kind, on, off in results:
        assert on.result is not None and off.result is not None
        faults = sum(1 for r in on.rows if r.fault != "none")
        rows.append(
            (
                kind,
                str(len(on.rows)),
                str(on.result.requests),
                str(on.result.lost),
                str(on.result.unaccounted),
                str(on.result.sessions.sessions),
                str(on.result.sessions.normal),
                str(on.result.sessions.going_away),
                str(on.result.sessions.unclean - on.result.sessions.unexplained),
                str(on.result.sessions.unexplained),
                str(faults),
                str(len(off.rows)),
                str(off.result.requests),
                str(off.result.lost),
                str(off.result.unaccounted),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    out.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return out


async def main(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="drain-soak-"))
    print(
        f"soak: {args.cycles} cycles per balancer ({', '.join(args.balancers)}), {args.control_cycles} drain-off "
        f"control cycles each, seed {args.seed}, logs in {workdir}",
        flush=True,
    )
    started = time.monotonic()
    failures: list[str] = []
    results: list[tuple[str, chaos.Fleet, chaos.Fleet]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for kind in args.balancers:
            if balancers.binary(kind) is None:
                failures.append(f"{kind} is not installed")
                continue
            on, problems = await run(
                kind, chaos.DRAIN_SECS, args.cycles, 1, args.seed, workdir / f"{kind}-drain-on", session
            )
            failures += [f"{kind}: {p}" for p in problems]
            assert on.result is not None
            print(f"\n{kind}, drain on: {chaos.format_reconciliation(on.result)}", flush=True)
            for line in on.unexplained_sessions():
                print(f"  unexplained session: {line}")
            if not on.result.clean:
                failures.append(
                    f"{kind} drain on: {on.result.unaccounted} unaccounted, {on.result.sessions.unexplained} "
                    f"sessions unexplained, {len(on.result.mismatches)} mismatches"
                )
            print(f"{kind}: RSS and open descriptors per router (sampled after every cycle):")
            for line in resource_lines(on.samples):
                print(line)
            steady = [s for s in on.samples if s.router in {p.replica.name for p in on.pods[len(on.rolled) :]}]
            growth = growth_problems(steady)
            failures += growth
            print(
                f"  steady router growth bound: RSS +{_mib(RSS_GROWTH_BYTES)} MiB and +{RSS_GROWTH_FRACTION:.0%}, "
                f"descriptors +{FDS_GROWTH} (median of the first tenth vs the last tenth): "
                + ("; ".join(growth) if growth else "held"),
                flush=True,
            )

            off, problems = await run(
                kind, 0, args.control_cycles, 0, args.seed + 1, workdir / f"{kind}-drain-off", session
            )
            failures += [f"{kind} control: {p}" for p in problems]
            assert off.result is not None
            print(f"\n{kind}, drain off (control): {chaos.format_reconciliation(off.result)}\n", flush=True)
            if off.result.unaccounted == 0:
                failures.append(
                    f"{kind}: the drain-off control lost nothing unaccounted: the harness cannot see a loss"
                )
            results.append((kind, on, off))

    print(f"\nsoak summary ({(time.monotonic() - started) / 60:.1f} min):")
    for line in summary_table(results):
        print(line)
    if failures:
        print("\nSOAK FAILED:")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print("\nsoak passed: nothing lost with the drain that no fault explains; the controls lost requests")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m e2e.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cycles",
        type=int,
        default=int(os.environ.get("SOAK_CYCLES", DEFAULT_CYCLES)),
        help=f"cycles per balancer with the drain on (env SOAK_CYCLES; default {DEFAULT_CYCLES})",
    )
    parser.add_argument(
        "--control-cycles",
        type=int,
        default=int(os.environ.get("SOAK_CONTROL_CYCLES", DEFAULT_CONTROL_CYCLES)),
        help=f"drain-off control cycles per balancer (default {DEFAULT_CONTROL_CYCLES})",
    )
    parser.add_argument(
        "--balancers", type=lambda s: s.split(","), default=list(balancers.KINDS), help="comma-separated: haproxy,envoy"
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "15")))
    parser.add_argument("--workdir", default=None, help="where logs go (default: a new temporary directory)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
