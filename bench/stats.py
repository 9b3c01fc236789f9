"""Percentiles, medians and spreads. Pure functions, no I/O."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from drain_router_dev import load

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    out = {name: _or_nan(load.percentile(ordered, pct / 100.0, ordered=True)) for name, pct in PERCENTILES.items()}
    out["max"] = ordered[-1] if ordered else math.nan
    return out


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def summary(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median and min-max over rounds; ``spread`` is (max - min) / median."""
    vals = finite(values)
    if not vals:
        return {"median": None, "min": None, "max": None, "spread": None, "n": 0}
    med = statistics.median(vals)
    return {
        "median": med,
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "spread": (max(vals) - min(vals)) / abs(med) if med else None,
    }


def goal(
    name: str, threshold: float, kind: str, unit: str, value: dict[str, Any] | None, note: str = ""
) -> dict[str, Any]:
    """One row of the goal table: ``value``'s median (with its min and max) against ``threshold``,
    ``kind`` ``min`` (at least) or ``max`` (at most); not measured when it has no median."""
    med = value.get("median") if value else None
    if med is None:
        row = {"goal": name, "threshold": threshold, "unit": unit, "kind": kind, "measured": None, "met": None}
        return row | {"note": note or "not measured in this run"}
    if kind == "min":
        met, margin = med >= threshold, (med - threshold) / threshold
    else:
        met, margin = med <= threshold, (threshold - med) / threshold if threshold else -med
    return {
        "goal": name,
        "threshold": threshold,
        "unit": unit,
        "kind": kind,
        "measured": med,
        "min": value.get("min") if value else None,
        "max": value.get("max") if value else None,
        "met": met,
        "margin": margin,
        "note": note,
    }


# -- a side-by-side workload's records (tracing, activator) --------------------------------------


def ratio(records: Sequence[dict[str, Any]], workload: str, arm: str, base: str, metric: str) -> dict[str, Any]:
    """``arm``'s ``metric`` over ``base``'s, per round of ``workload``: median, min, max (and n)."""
    by_round: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["workload"] == workload:
            by_round.setdefault(record["round"], {})[record["target"]] = record["metrics"].get(metric)
    quotients = []
    for cell in by_round.values():
        mine, theirs = cell.get(arm), cell.get(base)
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) and theirs:
            quotients.append(mine / theirs)
    return summary(quotients)


def value(records: Sequence[dict[str, Any]], workload: str, arm: str, metric: str) -> dict[str, Any]:
    """``arm``'s ``metric`` in ``workload`` over the rounds: median, min, max (and n)."""
    got = [r["metrics"].get(metric) for r in records if r["workload"] == workload and r["target"] == arm]
    return summary([v for v in got if isinstance(v, (int, float))])


def sig(v: float) -> str:
    """Three significant figures, as the bench's table cells."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def cell(s: dict[str, Any], unit: str = "") -> str:
    """A summary as a table cell: the median (min–max when the rounds differ), or – when none."""
    if s.get("median") is None:
        return "–"
    med = sig(s["median"]) + (f" {unit}" if unit else "")
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{med} ({sig(s['min'])}–{sig(s['max'])})"
    return med


def times(s: dict[str, Any]) -> str:
    """A summary of ratios as a table cell: 1.23x (min–max)."""
    if s.get("median") is None:
        return "–"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{s['median']:.2f}x ({s['min']:.2f}–{s['max']:.2f})"
    return f"{s['median']:.2f}x"
