"""The tracing workload's ratios, goals and table, from its bench records (bench/tracing_overhead.py).
Pure.

Every ratio is an arm's figure over the off arm's in the same round, then the median (min–max) over
rounds, as the bench's other ratios are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats

#: The arms, in table order, and how the table names them.
ARMS = {"off": "tracing off", "ratio0": "`--tracing`, ratio 0", "ratio1": "`--tracing`, ratio 1"}
#: ratio 0's and ratio 1's CPU per small GET over off's.
GOALS = (("ratio0", 1.03), ("ratio1", 1.25))
CPU = "target_cpu_us_per_unit"


def _cells(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["workload"].startswith("tracing_")]


def workloads(records: Sequence[dict[str, Any]]) -> list[str]:
    """The measured workloads of the tracing records (small GET first, then the paced streams)."""
    names = {r["workload"] for r in _cells(records)} - {"tracing_totals"}
    return sorted(names, key=lambda w: (w != "tracing_small_get", w))


def ratio(records: Sequence[dict[str, Any]], workload: str, arm: str, metric: str) -> dict[str, Any]:
    """``arm``'s ``metric`` over the off arm's, per round of ``workload``: median, min, max (and n)."""
    return stats.ratio(_cells(records), workload, arm, "off", metric)


def value(records: Sequence[dict[str, Any]], workload: str, arm: str, metric: str) -> dict[str, Any]:
    """``arm``'s ``metric`` in ``workload`` over the rounds: median, min, max (and n)."""
    return stats.value(_cells(records), workload, arm, metric)


def goals(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals on the small GET workload: CPU per request at ratio 0 ≤ 1.03x off's, at
    ratio 1 ≤ 1.25x (off against the tree before tracing is not one of them: the off arm is the
    plain router)."""
    if not any(r["workload"] == "tracing_small_get" for r in records):
        return []
    out = []
    for arm, threshold in GOALS:
        got = ratio(records, "tracing_small_get", arm, CPU)
        name = f"router CPU per small GET with tracing at ratio {arm[-1]} / tracing off"
        skipped = [r["metrics"].get("skipped") for r in _cells(records) if r["target"] == arm]
        note = "" if got.get("median") is not None else next((s for s in skipped if s), "")
        out.append(stats.goal(name, threshold, "max", "x", got, note))
    return out


def _num(v: Any, digits: int = 0) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else "–"


def markdown(records: Sequence[dict[str, Any]], plan: dict[str, Any]) -> str:
    """The tracing table (one row per workload and arm) and a line on what the sink received."""
    names = workloads(records)
    if not names:
        return ""
    lines = [
        "Tracing: three routers in the same rounds, off (no `--tracing`), and `--tracing` with "
        "`OTEL_TRACES_SAMPLER=traceidratio` at 0 and at 1, exporting over OTLP/HTTP to the bench's own "
        "sink (its own process, on the load generator's core); ratios to off per round, then the median "
        "(min–max). Spans: what the sink received during the cell, per request (per stream for paced "
        "streams).",
        "",
        "| workload | router | throughput | / off | router CPU per unit | / off | spans exported per unit |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload in names:
        if workload == "tracing_small_get":
            label = f"small GET, {plan.get('small_connections')} connections (req/s, per request)"
            metric = "rate"
        else:
            conc = workload.rsplit("_", 1)[1]
            label = f"SSE {plan.get('paced_interval_ms', 30):g} ms/chunk, {conc} streams (chunks/s, per chunk)"
            metric = "events_per_s"
        for arm, name in ARMS.items():
            mine = [r for r in _cells(records) if r["workload"] == workload and r["target"] == arm]
            skipped = next((r["metrics"]["skipped"] for r in mine if "skipped" in r["metrics"]), None)
            if not mine:
                continue
            if skipped:
                lines.append(f"| {label} | {name} | skipped: {skipped} |" + " |" * 4)
                continue
            off = arm == "off"
            lines.append(
                f"| {label} | {name} | {stats.cell(value(records, workload, arm, metric))} | "
                f"{'–' if off else stats.times(ratio(records, workload, arm, metric))} | "
                f"{stats.cell(value(records, workload, arm, CPU), 'µs')} | "
                f"{'–' if off else stats.times(ratio(records, workload, arm, CPU))} | "
                f"{'–' if off else stats.cell(value(records, workload, arm, 'spans_per_unit'))} |"
            )
    totals = {r["target"]: r["metrics"] for r in _cells(records) if r["workload"] == "tracing_totals"}
    parts = []
    for arm in ("ratio0", "ratio1"):
        t = totals.get(arm)
        if not t:
            continue
        spans, posts, size = t.get("spans_exported"), t.get("export_requests"), t.get("export_bytes")
        per_span = f", {size / spans:,.0f} B a span" if spans and size else ""
        parts.append(
            f"ratio {arm[-1]}: {_num(spans)} spans in {_num(posts)} export requests ({_num((size or 0) / 2**20, 1)} MiB"
            f"{per_span}) for {_num(t.get('requests_served'))} requests served, {_num(t.get('spans_dropped'))} dropped"
        )
    if parts:
        lines += [
            "",
            "What the sink received over the whole run (the routers flush at exit): " + "; ".join(parts) + ".",
        ]
    return "\n".join(lines) + "\n"
