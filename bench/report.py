"""From a results file to what a reader sees: medians and min-max over rounds, per-round ratios,
the bench's goals (met or missed, by how much), a markdown table and a PNG chart."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from bench import activator_report, front_report, overload_report, stats, targets, tracing_report
from bench.workloads import GROUPS, group_of

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
BASELINES = ("direct", "nginx", "envoy", "aiohttp", "before")
#: The table's columns and the chart's bars: the targets in run order.
TARGET_ORDER = targets.NAMES

#: Per workload, the metrics worth summarising (name, unit, higher_is_better).
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "small_get": [
        ("rate", "req/s", True),
        ("lat_p50_ms", "ms", False),
        ("lat_p99_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/req", False),
        ("loadgen_core", "cores", False),
    ],
    "sse_burst": [
        ("streams_per_s", "streams/s", True),
        ("ttfb_p50_ms", "ms", False),
        ("gap_p99_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/event", False),
        ("loadgen_core", "cores", False),
    ],
    "sse_oneread": [
        ("streams_per_s", "streams/s", True),
        ("ttfb_p50_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/event", False),
        ("loadgen_core", "cores", False),
    ],
    "sse_followed": [
        ("events_per_s", "events/s", True),
        ("streams_per_s", "streams/s", True),
        ("ttfb_p50_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/event", False),
        ("loadgen_core", "cores", False),
    ],
    "sse_paced": [
        ("events_per_s", "events/s", True),
        ("ttfb_p50_ms", "ms", False),
        ("ttfb_p99_ms", "ms", False),
        ("gap_p50_ms", "ms", False),
        ("gap_p99_ms", "ms", False),
        ("gap_p999_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/event", False),
        ("target_core", "cores", False),
        ("loadgen_core", "cores", False),
        ("errors", "", False),
    ],
    "upload_1mib": [
        ("mib_per_s", "MiB/s", True),
        ("lat_p50_ms", "ms", False),
        ("lat_p99_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/req", False),
    ],
    "idle_hold": [
        ("kib_per_stream_first", "KiB/stream", False),
        ("kib_per_stream_last", "KiB/stream", False),
        ("held_first", "streams", True),
        ("held_last", "streams", True),
        ("open_seconds_last", "s", False),
    ],
    "ws_echo": [
        ("messages_per_s", "messages/s", True),
        ("rtt_p50_ms", "ms", False),
        ("rtt_p99_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/message", False),
        ("loadgen_core", "cores", False),
    ],
    "ws_idle_hold": [
        ("kib_per_session", "KiB/session", False),
        ("sessions_open", "sessions", True),
    ],
    "grpc_stream": [
        ("messages_per_s", "messages/s", True),
        ("target_cpu_us_per_unit", "CPU µs/message", False),
        ("target_core", "cores", False),
        ("calls_done", "calls", True),
        ("loadgen_core", "cores", False),
        ("errors", "", False),
    ],
    "grpc_unary": [
        ("rate", "calls/s", True),
        ("lat_mean_ms", "ms", False),
        ("target_cpu_us_per_unit", "CPU µs/call", False),
        ("loadgen_core", "cores", False),
        ("errors", "", False),
    ],
    "grpc_idle_hold": [
        ("kib_per_stream", "KiB/stream", False),
        ("streams_open", "streams", True),
    ],
    "drain": [
        ("readyz_503_ms", "ms", False),
        ("exit_after_last_stream_ms", "ms", False),
        ("signal_to_exit_ms", "ms", False),
        ("streams_complete", "streams", True),
    ],
}


def _family(workload: str) -> str:
    if workload.startswith("overload"):
        return "overload"  # its own table and goals (bench/overload_report.py)
    if workload.startswith("tracing_"):  # its own table and goals (bench/tracing_report.py)
        return _family(workload.removeprefix("tracing_"))
    if workload.startswith("activator_"):
        return "activator"  # its own table and goals (bench/activator_report.py)
    return "sse_paced" if workload.startswith("sse_paced_") else workload


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    metrics = dict(record["metrics"])
    steps = metrics.pop("steps", None)
    if steps:
        metrics["kib_per_stream_first"] = steps[0]["kib_per_stream"]
        metrics["kib_per_stream_last"] = steps[-1]["kib_per_stream"]
        metrics["held_first"] = steps[0]["held"]
        metrics["held_last"] = steps[-1]["held"]
        metrics["open_seconds_last"] = steps[-1]["open_seconds"]
    return metrics


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads per workload/target/metric, per-round ratios, and the goals."""
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    by_round: dict[tuple[int, str, str], dict[str, Any]] = {}
    for record in results["records"]:
        flat = _flatten(record)
        by_cell.setdefault((record["workload"], record["target"]), []).append(flat)
        by_round[(record["round"], record["workload"], record["target"])] = flat
    workloads = list(dict.fromkeys(r["workload"] for r in results["records"]))
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for (workload, target), rows in by_cell.items():
        cell = summary.setdefault(workload, {}).setdefault(target, {})
        for metric, _, _ in METRICS.get(_family(workload), []):
            cell[metric] = stats.summary([row.get(metric) for row in rows])
        failures = [row["failed"] for row in rows if "failed" in row]
        if failures:
            cell["failed"] = failures
        skipped = [row["skipped"] for row in rows if "skipped" in row]
        if skipped:
            cell["skipped"] = skipped[0]
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    rounds = sorted({r["round"] for r in results["records"]})
    for workload in workloads:
        for base in BASELINES:
            per_metric: dict[str, Any] = {}
            for metric, _, _higher in METRICS.get(_family(workload), []):
                if metric in ("loadgen_core", "errors", "target_core"):
                    continue
                quotients, deltas = [], []
                for rnd in rounds:
                    mine = by_round.get((rnd, workload, "router"), {}).get(metric)
                    theirs = by_round.get((rnd, workload, base), {}).get(metric)
                    if _num(mine) and _num(theirs):
                        if theirs:
                            quotients.append(mine / theirs)
                        deltas.append(mine - theirs)
                if quotients or deltas:
                    per_metric[metric] = {"ratio": stats.summary(quotients), "delta": stats.summary(deltas)}
            if per_metric:
                ratios.setdefault(workload, {})[f"router/{base}"] = per_metric
    out = {"summary": summary, "ratios": ratios}
    out["goals"] = goals(results, out)
    out["noise"] = noise(summary)
    return out


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def noise(summary: dict[str, Any]) -> dict[str, Any]:
    """Round-to-round spread ((max - min) / median) of each target's headline metric; the direct
    column is the noise floor of the machine and the client."""
    heads = {
        "small_get": "rate",
        "sse_burst": "streams_per_s",
        "sse_oneread": "streams_per_s",
        "sse_followed": "events_per_s",
        "upload_1mib": "mib_per_s",
        "ws_echo": "messages_per_s",
        "grpc_stream": "messages_per_s",
        "grpc_unary": "rate",
    }
    out: dict[str, Any] = {}
    for workload, cells in summary.items():
        family = _family(workload)
        metric = heads.get(family if workload.startswith("tracing_") else workload) or (
            "events_per_s" if family == "sse_paced" else None
        )
        if not metric:
            continue
        spreads = {t: c[metric]["spread"] for t, c in cells.items() if metric in c and c[metric]["spread"] is not None}
        if spreads:
            out[workload] = {"metric": metric, "spread_by_target": spreads, "max_spread": max(spreads.values())}
    return out


def goals(results: dict[str, Any], derived: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench's goals, evaluated on the medians of per-round values."""
    ratios, summary = derived["ratios"], derived["summary"]
    out: list[dict[str, Any]] = []
    # The tracing workload's records are its own goals' (bench/tracing_report.py), not small GET's.
    ran = {_family(r["workload"]) for r in results["records"] if not r["workload"].startswith("tracing_")}

    def add(
        name: str,
        threshold: float,
        kind: str,
        value: dict[str, Any] | None,
        unit: str,
        note: str = "",
        *,
        workload: str,
    ) -> None:
        if _family(workload) not in ran:
            return  # a run of some workloads only: the others' goals are not its subject
        out.append(stats.goal(name, threshold, kind, unit, value, note))

    def ratio(workload: str, base: str, metric: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = ratios.get(workload, {}).get(f"router/{base}", {}).get(metric, {}).get("ratio")
        return value

    # the traffic path at nginx's cost (nginx shares the upstream's core, as the router does);
    # a later round tightened the streaming goals and added CPU per small GET, the stream arriving in one
    # read and the upload.
    conns = results["plan"]["small_connections"]
    add(
        f"small GET at {conns} connections (req/s, router / nginx)",
        0.8,
        "min",
        ratio("small_get", "nginx", "rate"),
        "x",
        workload="small_get",
    )
    add(
        f"small GET at {conns} connections (req/s, router / Envoy)",
        1.5,
        "min",
        ratio("small_get", "envoy", "rate"),
        "x",
        workload="small_get",
    )
    add(
        "proxy CPU per small GET (router / nginx)",
        1.5,
        "max",
        ratio("small_get", "nginx", "target_cpu_us_per_unit"),
        "x",
        workload="small_get",
    )
    paced = sorted((w for w in ratios if w.startswith("sse_paced_")), key=lambda w: int(w.rsplit("_", 1)[1]))
    for workload in paced:
        conc = workload.rsplit("_", 1)[1]
        add(
            f"{conc} paced streams (chunks/s, router / nginx)",
            0.95,
            "min",
            ratio(workload, "nginx", "events_per_s"),
            "x",
            workload=workload,
        )
        add(
            f"{conc} paced streams (CPU per chunk, router / nginx)",
            1.15,
            "max",
            ratio(workload, "nginx", "target_cpu_us_per_unit"),
            "x",
            workload=workload,
        )
    add(
        "64-chunk bursts (streams/s, router / nginx)",
        0.95,
        "min",
        ratio("sse_burst", "nginx", "streams_per_s"),
        "x",
        workload="sse_burst",
    )
    add(
        "64-chunk bursts (CPU per chunk, router / nginx)",
        1.2,
        "max",
        ratio("sse_burst", "nginx", "target_cpu_us_per_unit"),
        "x",
        workload="sse_burst",
    )
    add(
        "64-chunk stream in one upstream read (streams/s, router / nginx)",
        0.95,
        "min",
        ratio("sse_oneread", "nginx", "streams_per_s"),
        "x",
        workload="sse_oneread",
    )
    add(
        "64-chunk stream in one read (CPU per chunk, router / nginx)",
        1.3,
        "max",
        ratio("sse_oneread", "nginx", "target_cpu_us_per_unit"),
        "x",
        workload="sse_oneread",
    )
    if paced:
        last = paced[-1]
        conc = last.rsplit("_", 1)[1]
        add(
            f"p50 time to first byte at {conc} streams (router / nginx)",
            1.1,
            "max",
            ratio(last, "nginx", "ttfb_p50_ms"),
            "x",
            workload=last,
        )
    add(
        "1 MiB upload (MiB/s, router / nginx)",
        0.95,
        "min",
        ratio("upload_1mib", "nginx", "mib_per_s"),
        "x",
        workload="upload_1mib",
    )
    router_hold = summary.get("idle_hold", {}).get("router", {})
    held = results["plan"]["hold_steps"][-1]
    add(
        f"RSS per held idle stream with {held} held (router)",
        6.5,
        "max",
        router_hold.get("kib_per_stream_last"),
        "KiB",
        workload="idle_hold",
    )
    # WebSocket sessions through the router, against nginx as a WebSocket proxy.
    plan = results["plan"]
    if "ws_sessions" in plan:
        skipped = summary.get("ws_echo", {}).get("router", {}).get("skipped")
        note = f"router skipped: it {skipped}" if skipped else ""
        sessions = plan["ws_sessions"]
        add(
            f"WebSocket echo, {sessions} sessions (messages/s, router / nginx)",
            0.95,
            "min",
            ratio("ws_echo", "nginx", "messages_per_s"),
            "x",
            note,
            workload="ws_echo",
        )
        add(
            "WebSocket echo (CPU per message, router / nginx)",
            1.3,
            "max",
            ratio("ws_echo", "nginx", "target_cpu_us_per_unit"),
            "x",
            note,
            workload="ws_echo",
        )
        router_ws_hold = summary.get("ws_idle_hold", {}).get("router", {})
        hold_skipped = router_ws_hold.get("skipped")
        add(
            f"RSS per idle WebSocket session with {plan['ws_hold_sessions']} open (router)",
            8.0,
            "max",
            router_ws_hold.get("kib_per_session"),
            "KiB",
            f"router skipped: it {hold_skipped}" if hold_skipped else "",
            workload="ws_idle_hold",
        )
    # gRPC through the router's own HTTP/2 listener, against Envoy and nginx as gRPC proxies.
    if any(w in summary for w in ("grpc_stream", "grpc_idle_hold")):
        add(
            f"gRPC streamed tokens, {plan['grpc_streams']} calls (messages/s, router / Envoy)",
            1.0,
            "min",
            ratio("grpc_stream", "envoy", "messages_per_s"),
            "x",
            workload="grpc_stream",
        )
        add(
            "gRPC streamed tokens (CPU per message, router / nginx)",
            1.5,
            "max",
            ratio("grpc_stream", "nginx", "target_cpu_us_per_unit"),
            "x",
            workload="grpc_stream",
        )
        add(
            f"RSS per idle open gRPC stream with {plan['grpc_hold_streams']} open (router)",
            16.0,
            "max",
            summary.get("grpc_idle_hold", {}).get("router", {}).get("kib_per_stream"),
            "KiB",
            workload="grpc_idle_hold",
        )
    router_drain = summary.get("drain", {}).get("router", {})
    add("/readyz 503 after SIGTERM (router)", 50.0, "max", router_drain.get("readyz_503_ms"), "ms", workload="drain")
    add(
        "exit after the last stream ends in closing (router)",
        100.0,
        "max",
        router_drain.get("exit_after_last_stream_ms"),
        "ms",
        workload="drain",
    )
    # the engine past its capacity behind the router's admission control.
    out += overload_report.goals(results["records"])
    # what --tracing costs, at sampling ratio 0 and 1, against the router without it.
    out += tracing_report.goals(results["records"])
    # what the activator costs per relayed and per held request, against the router.
    out += activator_report.goals(results["records"])
    return out


# -- rendering ------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if unit == "x":
        return f"{value:.2f}x"
    mag = abs(value)
    if mag >= 1000:
        text = f"{value:,.0f}"
    elif mag >= 100:
        text = f"{value:.0f}"
    elif mag >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _cell(summary: dict[str, Any] | None, unit: str = "") -> str:
    if not summary or summary.get("median") is None:
        return "–"
    med, lo, hi = summary["median"], summary["min"], summary["max"]
    if summary.get("n", 1) > 1 and lo != hi:
        return f"{_fmt(med, unit)} ({_fmt(lo)}–{_fmt(hi)})"
    return _fmt(med, unit)


ROWS: list[tuple[str, str, str, str]] = [
    # (workload, metric, row label, unit)
    ("small_get", "rate", "small GET, {small_connections} connections: req/s", ""),
    ("small_get", "lat_p99_ms", "small GET: p99 latency", "ms"),
    ("small_get", "target_cpu_us_per_unit", "small GET: proxy CPU per request", "µs"),
    ("sse_burst", "streams_per_s", "SSE 64 chunks back to back, {burst_concurrency} streams: streams/s", ""),
    ("sse_burst", "target_cpu_us_per_unit", "SSE back to back: proxy CPU per chunk", "µs"),
    ("sse_oneread", "streams_per_s", "SSE 64 chunks in one upstream write, {burst_concurrency} streams: streams/s", ""),
    ("sse_oneread", "target_cpu_us_per_unit", "SSE in one write: proxy CPU per chunk", "µs"),
    (
        "sse_followed",
        "events_per_s",
        "SSE completions followed (POST), 64 events back to back, {burst_concurrency} streams: events/s",
        "",
    ),
    ("sse_followed", "target_cpu_us_per_unit", "SSE followed: proxy CPU per event", "µs"),
    ("sse_paced_{c}", "events_per_s", "SSE {interval} ms/chunk, {c} streams: chunks/s", ""),
    ("sse_paced_{c}", "ttfb_p50_ms", "SSE {c} streams: p50 time to first byte", "ms"),
    ("sse_paced_{c}", "gap_p99_ms", "SSE {c} streams: p99 inter-chunk gap", "ms"),
    ("sse_paced_{c}", "target_cpu_us_per_unit", "SSE {c} streams: proxy CPU per chunk", "µs"),
    ("upload_1mib", "mib_per_s", "1 MiB upload, {upload_connections} connections: MiB/s", ""),
    ("idle_hold", "kib_per_stream_first", "RSS per held idle stream, {hold_first} held", "KiB"),
    ("idle_hold", "kib_per_stream_last", "RSS per held idle stream, {hold_last} held", "KiB"),
    ("ws_echo", "messages_per_s", "WebSocket echo, {ws_sessions} sessions: messages/s", ""),
    ("ws_echo", "rtt_p99_ms", "WebSocket echo: p99 round trip", "ms"),
    ("ws_echo", "target_cpu_us_per_unit", "WebSocket echo: proxy CPU per message", "µs"),
    ("ws_idle_hold", "kib_per_session", "RSS per idle WebSocket session, {ws_hold} open", "KiB"),
    (
        "grpc_stream",
        "messages_per_s",
        "gRPC Generate, {grpc_streams} calls of {grpc_messages} tokens, unpaced: messages/s",
        "",
    ),
    ("grpc_stream", "target_cpu_us_per_unit", "gRPC streamed: proxy CPU per message", "µs"),
    ("grpc_unary", "rate", "gRPC unary Echo, {grpc_unary} at a time ({grpc_client}): calls/s", ""),
    ("grpc_unary", "lat_mean_ms", "gRPC unary: mean latency", "ms"),
    ("grpc_unary", "target_cpu_us_per_unit", "gRPC unary: proxy CPU per call", "µs"),
    ("grpc_idle_hold", "kib_per_stream", "RSS per idle open gRPC stream, {grpc_hold} open", "KiB"),
    ("drain", "readyz_503_ms", "drain: signal to readiness 503", "ms"),
    ("drain", "exit_after_last_stream_ms", "drain: last stream end to process exit", "ms"),
]


#: The groups of workloads, in run order, and how the header names their rows.
GROUP_NAMES = {group.name: group.label for group in GROUPS}


def _group(workload: str) -> str:
    """Which group of workloads (``--workloads``) a record's workload belongs to."""
    return group_of(workload).name


def _run_of(results: dict[str, Any]) -> dict[str, Any]:
    """What the table's header says of one run."""
    plan = results["plan"]
    workloads = sorted({r["workload"] for r in results["records"]})
    return {
        "started_at": results["started_at"],
        "mode": results["mode"],
        "rounds": plan["rounds"],
        "seconds": plan["seconds"],
        "wall_seconds": results["wall_seconds"],
        "machine": results["machine"],
        "workloads": workloads,
        "groups": sorted({_group(w) for w in workloads}, key=list(GROUP_NAMES).index),
    }


def _run_line(run: dict[str, Any], noise_by_workload: dict[str, Any], several: bool) -> str:
    machine = run["machine"]
    pinned = (
        f"load generator pinned to core {machine['loadgen_cpus']}, upstream and proxies on {machine['server_cpus']}"
        if machine.get("loadgen_cpus")
        else "no pinning (one core)"
    )
    mine = set(run["workloads"])
    all_spreads = sorted(s for w, n in noise_by_workload.items() if w in mine for s in n["spread_by_target"].values())
    noise_med = all_spreads[len(all_spreads) // 2] if all_spreads else 0.0
    noise_max = all_spreads[-1] if all_spreads else 0.0
    shared = machine.get("foreign_cores", 0)
    rows = " and ".join(GROUP_NAMES[g] for g in run["groups"])
    shape = (  # the overload measurement is one pass of its own windows (its table says them)
        "one pass"
        if run["groups"] == ["overload"]
        else f"{run['rounds']} interleaved rounds, {run['seconds']:g} s windows"
    )
    return (
        f"Run `{run['started_at']}`{f', for the {rows} rows' if several else ''} ({run['mode']}, {shape}, "
        f"{run['wall_seconds']:.0f} s in all) on "
        f"{machine['cores']} cores ({machine['cpu_model']}), {pinned}. Noise: the round-to-round spread "
        f"(max−min)/median of a throughput cell is {_fmt(100 * noise_med)} % at the median, up to "
        f"{_fmt(100 * noise_max)} %. Other processes used {shared:.2f} cores on average during the run"
        f"{' (the machine was shared with other work: read single cells with care, ratios of the same round less so)' if shared > 0.1 else ''}."
    )


def _unary_client(results: dict[str, Any]) -> str:
    clients = {r["metrics"].get("client") for r in results["records"] if r["workload"] == "grpc_unary"}
    return "/".join(sorted(c for c in clients if c)) or "h2load"


def markdown(results: dict[str, Any], derived: dict[str, Any]) -> str:
    plan = results["plan"]
    summary = derived["summary"]
    present = [t for t in TARGET_ORDER if t in results["targets"] and results["targets"][t]["available"]]
    missing = {t: v["reason"] for t, v in results["targets"].items() if not v["available"]}
    fmt = {
        "small_connections": plan["small_connections"],
        "burst_concurrency": plan["burst_concurrency"],
        "interval": f"{plan['paced_interval_ms']:g}",
        "upload_connections": plan["upload_connections"],
        "hold_first": plan["hold_steps"][0],
        "hold_last": plan["hold_steps"][-1],
        "ws_sessions": plan.get("ws_sessions"),
        "ws_hold": plan.get("ws_hold_sessions"),
        "grpc_streams": plan.get("grpc_streams"),
        "grpc_messages": f"{plan.get('grpc_messages') or 0:,}",
        "grpc_unary": f"{plan.get('grpc_unary_connections')}×{plan.get('grpc_unary_streams')}",
        "grpc_client": _unary_client(results),
        "grpc_hold": f"{plan.get('grpc_hold_streams') or 0:,}",
    }
    lines = []
    runs = results.get("runs") or [_run_of(results)]
    for run in runs:
        lines.append(_run_line(run, derived["noise"], len(runs) > 1))
    lines.append("")
    lines.append("| goal | target | measured: median (min–max) | |")
    lines.append("| --- | --- | --- | --- |")
    for goal in derived["goals"]:
        unit = goal["unit"]
        thr = ("≥ " if goal.get("kind", "min") == "min" else "≤ ") + _fmt(goal["threshold"], unit)
        if goal["measured"] is None:
            lines.append(f"| {goal['goal']} | {thr} | – | {goal['note']} |")
            continue
        got = _cell({"median": goal["measured"], "min": goal["min"], "max": goal["max"], "n": 2}, unit)
        verdict = "met" if goal["met"] else f"**missed by {_fmt(abs(goal['margin']) * 100)} %**"
        lines.append(f"| {goal['goal']} | {thr} | {got} | {verdict} |")
    lines.append("")
    header = "| workload | " + " | ".join(results["targets"][t]["label"] for t in present) + " |"
    lines.append(header)
    lines.append("| --- |" + " --- |" * len(present))
    for workload_t, metric, label_t, unit in ROWS:
        for conc in plan["paced_concurrency"] if "{c}" in workload_t else [None]:
            workload = workload_t.format(c=conc)
            if workload not in summary:
                continue
            label = label_t.format(c=conc, **fmt)
            cells = [
                "skipped"
                if summary[workload].get(t, {}).get("skipped")
                else _cell(summary[workload].get(t, {}).get(metric), unit)
                for t in present
            ]
            if workload == "idle_hold":  # say so where a target held fewer streams than asked
                counts = "held_first" if metric == "kib_per_stream_first" else "held_last"
                step = plan["hold_steps"][0 if counts == "held_first" else -1]
                for i, t in enumerate(present):
                    held = (summary[workload].get(t, {}).get(counts) or {}).get("median")
                    if held is not None and held < step:
                        cells[i] += f" ({held:,.0f} held)"
            if all(c in ("–", "skipped") for c in cells) and not any(
                summary[workload].get(t, {}).get("skipped") for t in present
            ):
                continue
            if all(c == "–" for c in cells) or (metric == "kib_per_stream_last" and len(plan["hold_steps"]) < 2):
                continue
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    bases = [b for b in BASELINES if b in present and "router" in present]
    if bases:
        lines.append(
            "Ratios, router / X, taken per round and then the median (min–max): throughput "
            "(above 1 is faster than X) and proxy CPU per unit (above 1 costs more than X)."
        )
        lines.append("")
        lines.append("| workload | metric | " + " | ".join(f"router / {b}" for b in bases) + " |")
        lines.append("| --- | --- |" + " --- |" * len(bases))
        heads = [
            ("small_get", "rate", "req/s"),
            ("small_get", "target_cpu_us_per_unit", "CPU per request"),
            ("sse_burst", "streams_per_s", "streams/s"),
            ("sse_burst", "target_cpu_us_per_unit", "CPU per chunk"),
            ("sse_oneread", "streams_per_s", "streams/s"),
            ("sse_oneread", "target_cpu_us_per_unit", "CPU per chunk"),
            ("sse_followed", "events_per_s", "events/s"),
            ("sse_followed", "target_cpu_us_per_unit", "CPU per event"),
            *(
                (f"sse_paced_{c}", m, label)
                for c in plan["paced_concurrency"]
                for m, label in (("events_per_s", "chunks/s"), ("target_cpu_us_per_unit", "CPU per chunk"))
            ),
            ("upload_1mib", "mib_per_s", "MiB/s"),
            ("ws_echo", "messages_per_s", "messages/s"),
            ("ws_echo", "target_cpu_us_per_unit", "CPU per message"),
            ("grpc_stream", "messages_per_s", "messages/s"),
            ("grpc_stream", "target_cpu_us_per_unit", "CPU per message"),
            ("grpc_unary", "rate", "calls/s"),
            ("grpc_unary", "target_cpu_us_per_unit", "CPU per call"),
        ]
        for workload, metric, label in heads:
            row = [
                (derived["ratios"].get(workload, {}).get(f"router/{b}", {}).get(metric) or {}).get("ratio")
                for b in bases
            ]
            if any(r and r.get("median") is not None for r in row):
                name = {
                    "small_get": "small GET",
                    "sse_burst": "SSE back to back",
                    "sse_oneread": "SSE in one upstream write",
                    "sse_followed": "SSE completions followed",
                    "upload_1mib": "1 MiB upload",
                    "ws_echo": "WebSocket echo",
                    "grpc_stream": "gRPC streamed tokens",
                    "grpc_unary": "gRPC unary",
                }.get(workload) or f"SSE paced, {workload.rsplit('_', 1)[1]} streams"
                lines.append(f"| {name} | {label} | " + " | ".join(_cell(r, "x") for r in row) + " |")
        lines.append("")
    client_cores = [
        summary.get(w, {}).get(t, {}).get("loadgen_core", {}).get("median") for w in summary for t in present
    ]
    client_cores = [c for c in client_cores if c is not None]
    if client_cores:
        grpc = "; for gRPC an h2c client that counts messages without decoding them, and h2load for unary calls"
        lines.append(
            f"The load generator (wrk for plain requests, the aiohttp client for SSE and WebSocket"
            f"{grpc if any(w.startswith('grpc_') for w in summary) else ''}) used up to "
            f"{max(client_cores):.2f} of its core; a cell where it is near 1.0 is client-bound."
        )
    for workload, kind in (("ws_echo", "WebSocket"), ("grpc_stream", "gRPC")):
        skips = {t: c["skipped"] for t, c in summary.get(workload, {}).items() if c.get("skipped")}
        if skips:
            lines.append(
                f"{kind} rows skipped for: "
                + "; ".join(f"{results['targets'][t]['label']} ({r})" for t, r in skips.items())
                + "."
            )
    if missing:
        lines.append("Not measured: " + "; ".join(f"{t} ({r})" for t, r in missing.items()) + ".")
    tables = [
        overload_report.markdown(results["records"]),
        tracing_report.markdown(results["records"], plan),
        activator_report.markdown(results["records"], plan),
        front_report.markdown(results["records"], plan),
    ]
    return "\n".join(lines) + "\n" + "".join(f"\n{table}" for table in tables if table)


def inject(path: Path, block: str) -> bool:
    """Replace what is between the bench markers in ``path``; False when the markers are absent."""
    if not path.exists():
        return False
    text = path.read_text()
    if BEGIN not in text or END not in text:
        return False
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: f"{BEGIN}\n{block}{END}", text, flags=re.S)
    path.write_text(new)
    return True


def chart(results: dict[str, Any], derived: dict[str, Any], path: Path) -> bool:
    """A PNG of the headline numbers, min-max whiskers over rounds. False when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    summary = derived["summary"]
    plan = results["plan"]
    present = [t for t in TARGET_ORDER if t in results["targets"] and results["targets"][t]["available"]]
    colors = {
        "direct": "#999999",
        "router": "#d62728",
        "front": "#17becf",
        "aiohttp": "#e377c2",
        "raw": "#8c564b",
        "nginx": "#2ca02c",
        "haproxy": "#1f77b4",
        "envoy": "#9467bd",
        "traefik": "#ff7f0e",
    }
    paced = [f"sse_paced_{c}" for c in plan["paced_concurrency"]]
    panels = [
        ("small GET, req/s", [("small_get", "rate")], None),
        ("SSE back to back, streams/s", [("sse_burst", "streams_per_s")], None),
        ("SSE paced: chunks/s vs direct", [(w, "events_per_s") for w in paced], "direct"),
        ("SSE paced: p50 TTFB (log), ms", [(w, "ttfb_p50_ms") for w in paced], None),
        ("SSE paced: p99 inter-chunk gap (log), ms", [(w, "gap_p99_ms") for w in paced], None),
        (
            "RSS per held idle stream, KiB",
            [("idle_hold", "kib_per_stream_first"), ("idle_hold", "kib_per_stream_last")],
            None,
        ),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, series, relative) in zip(axes.flat, panels):
        groups = [s for s in series if s[0] in summary]
        width = 0.8 / max(1, len(present))
        for i, target in enumerate(present):
            meds, los, his = [], [], []
            for workload, metric in groups:
                cell = summary[workload].get(target, {}).get(metric) or {}
                base = summary[workload].get(relative, {}).get(metric, {}).get("median") if relative else 1.0
                med = cell.get("median")
                if med is None or not base:
                    meds.append(0.0)
                    los.append(0.0)
                    his.append(0.0)
                    continue
                meds.append(med / base)
                los.append((med - cell["min"]) / base)
                his.append((cell["max"] - med) / base)
            xs = [g + (i - (len(present) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, meds, width, yerr=[los, his], color=colors.get(target), label=target, capsize=2)
        labels = []
        for workload, metric in groups:
            if workload.startswith("sse_paced_"):
                labels.append(workload.rsplit("_", 1)[1] + " streams")
            elif metric == "kib_per_stream_first":
                labels.append(f"{plan['hold_steps'][0]} held")
            elif metric == "kib_per_stream_last":
                labels.append(f"{plan['hold_steps'][-1]} held")
            else:
                labels.append("")
        ax.set_xticks(range(len(groups)), labels)
        ax.set_title(title, fontsize=10)
        if relative:
            ax.axhline(0.95, color="black", lw=0.8, ls="--")
        if title.endswith("(log), ms"):
            ax.set_yscale("log")  # 0.6 ms at 16 streams and 300 ms at 1000 on one axis
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    machine = results["machine"]
    fig.suptitle(
        f"drain-router bench {results['started_at']} ({results['mode']}, {plan['rounds']} rounds, "
        f"{machine['cores']} cores, median with min–max whiskers)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One results dict from several runs, newest first: each group of workloads (HTTP, WebSocket,
    gRPC) is taken from the newest run that has it, so a run of the gRPC workloads alone is shown
    beside the latest run of the others. Ratios stay within one run (a workload comes from one run,
    and its ratios are taken per round of that run); the header names each run. One part: itself."""
    if len(parts) == 1:
        return parts[0]
    taken: dict[str, int] = {}  # group -> index of the part it comes from
    for i, part in enumerate(parts):
        for record in part["records"]:
            taken.setdefault(_group(record["workload"]), i)
    used = sorted(set(taken.values()))
    primary = parts[taken.get("http", used[0])]
    records = [r for i, part in enumerate(parts) for r in part["records"] if taken.get(_group(r["workload"])) == i]
    target_info: dict[str, dict[str, Any]] = {}
    for i in used:
        for name, info in parts[i]["targets"].items():
            if name not in target_info or (info["available"] and not target_info[name]["available"]):
                target_info[name] = info
    plan: dict[str, Any] = {}
    for key in {k for i in used for k in parts[i]["plan"]}:
        owner = "grpc" if key.startswith("grpc_") else "ws" if key.startswith("ws_") else "http"
        owner = "tracing" if key.startswith("tracing_") else owner
        owner = "activator" if key.startswith("activator_") else owner
        for i in [taken[owner]] if owner in taken else used:
            if key in parts[i]["plan"]:
                plan[key] = parts[i]["plan"][key]
                break
    out = {k: v for k, v in primary.items() if k not in ("derived", "records", "targets", "plan")}
    out.update(records=records, targets=target_info, plan=plan)
    out["runs"] = [_run_of({**parts[i], "records": [r for r in records if r in parts[i]["records"]]}) for i in used]
    return out


def _groups_in(path: Path) -> set[str]:
    return {_group(r["workload"]) for r in json.loads(path.read_text())["records"]}


def latest_set(results_dir: Path, mode: str = "full") -> list[Path]:
    """The newest run of ``mode``, then, newest first, the older ones that add a group of workloads
    it lacks (what :func:`combine` takes)."""
    files = sorted(results_dir.glob(f"*-{mode}.json"), reverse=True)
    chosen: list[Path] = []
    covered: set[str] = set()
    for path in files:
        groups = _groups_in(path)
        if groups - covered:
            chosen.append(path)
            covered |= groups
        if covered >= set(GROUP_NAMES):
            break
    return chosen


def with_missing(results: dict[str, Any], results_dir: Path, mode: str = "full") -> dict[str, Any]:
    """``results`` combined with the newest runs of ``mode`` in ``results_dir`` for the groups of
    workloads it lacks (a run of the gRPC workloads alone, published beside the rest)."""
    have = {_group(r["workload"]) for r in results["records"]}
    parts = [results]
    for path in sorted(results_dir.glob(f"*-{mode}.json"), reverse=True):
        older = json.loads(path.read_text())
        groups = {_group(r["workload"]) for r in older["records"]} - have
        if groups and older["started_at"] != results["started_at"]:
            parts.append(older)
            have |= groups
    return combine(parts)


def latest(results_dir: Path, mode: str | None = "full") -> Path | None:
    files = sorted(results_dir.glob("*.json"))
    if mode:
        matching = [f for f in files if f.stem.endswith("-" + mode)]
        files = matching or files
    return files[-1] if files else None


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
