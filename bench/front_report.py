"""The front's table: ``drain-router front`` against the router alone, from the records of a run with
both targets (``--targets router,front``). Pure.

Every ratio is the front's figure over the router's in the same round, then the median (min–max)
over rounds, as the bench's other ratios are. The headline is the followed stream
(``sse_followed``): the front keeps the request's body and reads every event (one ``json.loads`` each,
whole events only) to be able to continue it; the same streams as ``GET``s (``sse_burst``) it only
relays. What the front adds to the router's CPU per event on the first, less what it adds on the
second, is what following costs (the request body's own cost, which the router pays too, taken out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats

FRONT, ROUTER = "front", "router"
CPU = "target_cpu_us_per_unit"
FOLLOWED, RELAYED = "sse_followed", "sse_burst"
#: (workload, throughput metric, its unit, what a unit of CPU is), in table order; the paced streams,
#: one row per concurrency, come after the one-read stream.
ROWS = (
    (FOLLOWED, "events_per_s", "events/s", "event"),
    (RELAYED, "events_per_s", "events/s", "event"),
    ("sse_oneread", "events_per_s", "events/s", "event"),
    ("sse_paced", "events_per_s", "events/s", "event"),
    ("small_get", "rate", "req/s", "request"),
    ("upload_1mib", "mib_per_s", "MiB/s", "request"),
)
NAMES = {
    FOLLOWED: "completions followed (POST, {chunks} events back to back, {streams} streams)",
    RELAYED: "the same streams as GETs, relayed only",
    "sse_oneread": "{chunks} events in one upstream write, {streams} streams",
    "small_get": "small GET, {connections} connections",
    "upload_1mib": "1 MiB upload",
}


def _both(records: Sequence[dict[str, Any]]) -> list[str]:
    """The workloads that have records of the front and of the router, in run order."""
    seen: dict[str, set[str]] = {}
    for record in records:
        seen.setdefault(record["workload"], set()).add(record["target"])
    return [w for w, who in seen.items() if {FRONT, ROUTER} <= who]


def ratio(records: Sequence[dict[str, Any]], workload: str, metric: str) -> dict[str, Any]:
    """The front's ``metric`` over the router's, per round of ``workload``."""
    return stats.ratio(records, workload, FRONT, ROUTER, metric)


def _cpu_by_round(records: Sequence[dict[str, Any]], workload: str) -> dict[int, dict[str, float]]:
    """Round -> target (the front, the router) -> CPU per unit in ``workload``, where measured."""
    out: dict[int, dict[str, float]] = {}
    for record in records:
        got = record["metrics"].get(CPU)
        if record["workload"] == workload and record["target"] in (FRONT, ROUTER) and isinstance(got, (int, float)):
            out.setdefault(record["round"], {})[record["target"]] = got
    return out


def _added(cells: dict[str, float]) -> float | None:
    return cells[FRONT] - cells[ROUTER] if FRONT in cells and ROUTER in cells else None


def added(records: Sequence[dict[str, Any]], workload: str) -> dict[str, Any]:
    """The front's CPU per unit minus the router's, per round of ``workload`` (µs)."""
    return stats.summary([_added(cells) for cells in _cpu_by_round(records, workload).values()])


def following(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What following costs the front per event, per round: what it adds to the router's CPU per
    event on the followed streams, less what it adds on the streams it only relays (µs)."""
    followed, relayed = _cpu_by_round(records, FOLLOWED), _cpu_by_round(records, RELAYED)
    deltas = []
    for rnd, cells in followed.items():
        a, b = _added(cells), _added(relayed.get(rnd, {}))
        if a is not None and b is not None:
            deltas.append(a - b)
    return stats.summary(deltas)


def _sign(s: dict[str, Any]) -> str:
    """A summary of differences in µs as a table cell: +1.23 µs (min–max)."""
    if s.get("median") is None:
        return "–"
    med = f"{s['median']:+.2f} µs"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{med} ({s['min']:+.2f}–{s['max']:+.2f})"
    return med


def _ordered(workloads: list[str]) -> list[tuple[str, str, str, str]]:
    """The rows of ``workloads`` (:data:`ROWS`), in table order, the paced streams by concurrency."""
    out = []
    for family, metric, unit, per in ROWS:
        if family == "sse_paced":
            mine = sorted((w for w in workloads if w.startswith("sse_paced_")), key=lambda w: int(w.rsplit("_", 1)[1]))
        else:
            mine = [w for w in workloads if w == family]
        out += [(w, metric, unit, per) for w in mine]
    return out


def _label(workload: str, plan: dict[str, Any]) -> str:
    if workload.startswith("sse_paced_"):
        return f"SSE {plan.get('paced_interval_ms', 0):g} ms/event, {workload.rsplit('_', 1)[1]} streams"
    return NAMES[workload].format(
        chunks=plan.get("burst_chunks"),
        streams=plan.get("burst_concurrency"),
        connections=plan.get("small_connections"),
    )


def markdown(records: Sequence[dict[str, Any]], plan: dict[str, Any]) -> str:
    """Per workload both ran: throughput and CPU per unit, the router's, the front's and their ratio;
    then what following costs per event."""
    both = _both(records)
    if not both:
        return ""
    lines = [
        "The front: `drain-router front --pods <upstream> --continuation completions` (the bench upstream "
        "as its one pod, answering `/readyz` as a pod's router does) against `drain-router serve` in "
        "front of the same upstream, in the same rounds. Followed: each stream a `POST /v1/completions` "
        "with a JSON body (`stream: true`, `max_tokens` the events asked for), which the front keeps "
        "and follows event by event; the router relays it as any other request. CPU per event includes "
        "the request's own cost spread over its events. Ratios front / router per round, then the "
        "median (min–max).",
        "",
        "| workload | figure | router | front | front / router | front − router |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for workload, metric, unit, per in _ordered(both):
        label = _label(workload, plan)
        for figure, key, shown, delta in (
            (unit, metric, "", "–"),
            (f"CPU per {per}", CPU, "µs", _sign(added(records, workload))),
        ):
            router = stats.value(records, workload, ROUTER, key)
            mine = stats.value(records, workload, FRONT, key)
            lines.append(
                f"| {label} | {figure} | {stats.cell(router, shown)} | {stats.cell(mine, shown)} | "
                f"{stats.times(ratio(records, workload, key))} | {delta} |"
            )
    cost = following(records)
    if cost.get("median") is not None:
        lines += [
            "",
            f"Following, per event: {_sign(cost)} of the front's CPU (its CPU per event over the router's on "
            "the followed streams, less the same on the streams it only relays).",
        ]
    failed = [f"{r['workload']} {r['target']}: {r['metrics']['failed']}" for r in records if _failed(r, both)]
    if failed:
        lines += ["", "Failed cells: " + "; ".join(failed) + "."]
    return "\n".join(lines) + "\n"


def _failed(record: dict[str, Any], workloads: list[str]) -> bool:
    return record["target"] in (FRONT, ROUTER) and record["workload"] in workloads and "failed" in record["metrics"]
