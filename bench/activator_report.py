"""The activator workload's ratios, goals and table, from its bench records (bench/activator_cost.py).
Pure.

Every ratio is the activator's figure over the router's in the same round, then the median
(min–max) over rounds, as the bench's other ratios are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats

RELAYED, HELD = "activator_small_get", "activator_held"
CPU = "target_cpu_us_per_unit"
#: (workload, metric, what it is, at most this many times the router's).
GOALS = (
    (RELAYED, CPU, "activator CPU per relayed small GET / the router's", 1.25),
    (HELD, "kib_per_held", "activator RSS per held request / the router's per queued request", 2.0),
)
#: The held cell's figures, in table order: (metric, what it is, unit).
HELD_ROWS = (
    ("kib_per_held", "RSS per held request", "KiB"),
    ("cpu_us_per_held", "CPU per request to accept and hold", "µs"),
    ("cpu_us_per_released", "CPU per request released (forwarded, answered)", "µs"),
)


def _cells(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["workload"].startswith("activator_")]


def ratio(records: Sequence[dict[str, Any]], workload: str, metric: str) -> dict[str, Any]:
    """The activator's ``metric`` over the router's, per round of ``workload``."""
    return stats.ratio(_cells(records), workload, "activator", "router", metric)


def _failed(records: Sequence[dict[str, Any]], workload: str) -> str:
    return next(
        (r["metrics"]["failed"] for r in _cells(records) if r["workload"] == workload and "failed" in r["metrics"]), ""
    )


def goals(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals: a relayed request at most 1.25x the router's CPU, a held request at most
    2x the memory of a request in the router's admission queue."""
    if not _cells(records):
        return []
    return [
        stats.goal(name, threshold, "max", "x", ratio(records, workload, metric), _failed(records, workload))
        for workload, metric, name, threshold in GOALS
    ]


def markdown(records: Sequence[dict[str, Any]], plan: dict[str, Any]) -> str:
    """One row per figure: the router's, the activator's, their ratio."""
    cells = _cells(records)
    if not cells:
        return ""
    held = plan.get("activator_held")
    lines = [
        "Activator: `drain-router activator` against `drain-router serve`, in the same rounds. Relayed: "
        f"small GETs ({plan.get('small_connections')} connections) through an activator whose service is "
        "awake, forwarding to the bench upstream as its pod, against the router in front of the same "
        f"upstream. Held: {held} small GETs held by a fresh activator for a service asleep (no pod), "
        f"against a fresh router holding them in its admission queue (`--max-concurrent-requests 1 "
        f"--queue-size {held}`, the slot taken by a held stream); then released (the pod listed, the slot "
        "freed). Ratios to the router per round, then the median (min–max).",
        "",
        "| figure | router | activator | activator / router |",
        "| --- | --- | --- | --- |",
    ]
    rows = [(RELAYED, "rate", "relayed small GET: throughput", "req/s")]
    rows += [(RELAYED, CPU, "relayed small GET: CPU per request", "µs")]
    rows += [(HELD, metric, name, unit) for metric, name, unit in HELD_ROWS]
    for workload, metric, name, unit in rows:
        router = stats.value(cells, workload, "router", metric)
        mine = stats.value(cells, workload, "activator", metric)
        lines.append(
            f"| {name} | {stats.cell(router, unit)} | {stats.cell(mine, unit)} | "
            f"{stats.times(ratio(records, workload, metric))} |"
        )
    lost = sum(r["metrics"].get("errors", 0) or 0 for r in cells if r["workload"] == HELD)
    failed = [f"{r['target']}: {r['metrics']['failed']}" for r in cells if "failed" in r["metrics"]]
    lines += ["", f"Held requests not answered 200 after the release: {lost}."]
    if isinstance(held, int) and held:
        lines[-1] += (
            f" The CPU meter counts whole 10 ms ticks: ±{10_000 / held:.0f} µs a request in the hold and "
            "release rows (read them as coarse)."
        )
    if failed:
        lines[-1] += " Failed cells: " + "; ".join(failed) + "."
    return "\n".join(lines) + "\n"
