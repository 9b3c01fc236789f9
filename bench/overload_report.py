"""The overload measurement's arms, goals and table, from its bench records. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats

#: The arms, in table order: what bounds the engine, and how its clients retry.
ARMS = ("direct", "router", "router_fixed", "router_noqueue", "envoy", "nginx")
KIND = {
    "direct": "direct",
    "router": "router",
    "router_fixed": "router",
    "router_noqueue": "router",
    "envoy": "envoy",
    "nginx": "nginx",
}
#: The arms measured unloaded too; the others compare with their kind's baseline.
BASELINE_ARMS = ("direct", "router", "envoy", "nginx")
GATE_GOAL_US = 2.0


def workload_of(load: float, unloaded: float) -> str:
    return "overload_unloaded" if load == unloaded else f"overload_{load:g}x"


def label(arm: str, setup: dict[str, Any]) -> str:
    b, q, t = setup["engine"]["batch"], setup["queue"], setup["queue_timeout_secs"]
    return {
        "direct": "direct (no bound)",
        "router": f"router, N={b} Q={q} T={t} s, clients honour Retry-After",
        "router_fixed": f"router, N={b} Q={q} T={t} s, clients wait a fixed 1 s",
        "router_noqueue": f"router, N={b} Q=0, clients honour Retry-After",
        "envoy": f"Envoy circuit breakers, max_requests {b}, max_pending_requests {q}",
        "nginx": f"nginx limit_conn {b}",
    }[arm]


def brief(m: dict[str, Any]) -> str:
    if "failed" in m or "skipped" in m:
        return str(m.get("failed") or m.get("skipped"))
    keys = ("goodput_x_capacity", "ttft_admitted_p99_ms", "rejected_429", "rejected_503", "admitted_first_retry_share")
    return " ".join(f"{k}={m[k]:.4g}" for k in keys if isinstance(m.get(k), (int, float)))


def _cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["workload"], r["target"]): r["metrics"] for r in records if r["workload"].startswith("overload")}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _goal(name: str, threshold: float, kind: str, value: float | None, unit: str, note: str = "") -> dict[str, Any]:
    return stats.goal(
        name, threshold, kind, unit, None if value is None else {"median": value, "min": value, "max": value}, note
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def goals(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals, on the router's arms: TTFT at 4x against unloaded, goodput against the
    engine's capacity, first retries admitted with the router's estimate against a fixed 1 s, and
    the gate's cost per request with nothing waiting."""
    cells = _cells(records)
    if not cells:
        return []
    out = []
    loads = sorted({w for w, _ in cells if w.endswith("x")}, key=lambda w: float(w[9:-1]))
    top = loads[-1] if loads else None
    base = _num(cells.get(("overload_unloaded", "router"), {}).get("ttft_admitted_p99_ms"))
    for arm, name in (("router", "router"), ("router_noqueue", "router, no queue")):
        if not any(t == arm for _, t in cells):
            continue
        got = cells.get((top or "", arm), {})
        out.append(
            _goal(
                f"p99 time to first token of admitted requests at {top[9:] if top else '?'} overload / unloaded "
                f"({name})",
                1.5,
                "max",
                _ratio(_num(got.get("ttft_admitted_p99_ms")), base),
                "x",
            )
        )
        for load in loads:
            m = cells.get((load, arm), {})
            out.append(
                _goal(
                    f"goodput at {load[9:]} overload / engine capacity ({name})",
                    0.95,
                    "min",
                    _num(m.get("goodput_x_capacity")),
                    "x",
                )
            )
    for load in loads:
        mine = _num(cells.get((load, "router"), {}).get("admitted_first_retry_share"))
        fixed = _num(cells.get((load, "router_fixed"), {}).get("admitted_first_retry_share"))
        if mine is not None or fixed is not None:
            out.append(
                _goal(
                    f"retries admitted at their first try at {load[9:]}: Retry-After honoured / a fixed 1 s "
                    "(router; goal: more)",
                    1.0,
                    "min",
                    _ratio(mine, fixed),
                    "x",
                )
            )
    gate = cells.get(("overload_gate", "router"))
    if gate is not None:
        out.append(
            _goal(
                "admission gate's CPU per request, nothing waiting (router)",
                GATE_GOAL_US,
                "max",
                _num(gate.get("gate_us")),
                "µs",
                str(gate.get("skipped", "")),
            )
        )
    return out


def _f(value: Any, digits: int = 0, unit: str = "") -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:,.{digits}f}{unit}"


def _pct(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{100 * value:.0f} %"


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """The overload table (one row per load and arm) and a line on the gate's cost."""
    cells = _cells(records)
    some = next((m for m in cells.values() if "setup" in m), None)
    if some is None:
        return ""
    setup = some["setup"]
    e = setup["engine"]
    capacity = next((m["capacity_tokens_per_s"] for m in cells.values() if "capacity_tokens_per_s" in m), None)
    lines = [
        f"Overload: the fake engine at batch size B = {e['batch']}, {e['interval_ms']} ms per token, "
        f"{e['tokens']} tokens per stream after a {e['prefill_ms']} ms prefill: capacity "
        f"{_f(capacity)} tokens/s. Poisson arrivals for {setup['warmup_secs']:g} + {setup['window_secs']:g} s "
        f"(figures from the last {setup['window_secs']:g} s), up to {setup['retries']} retries; unloaded = "
        f"{setup['unloaded']:g}x capacity.",
        "",
        "| load | bound | offered streams/s | goodput tokens/s (x capacity) | TTFT admitted p50 / p99 "
        "| TTFT from first try p50 / p99 | stream p99 | refused tries 429 / 503 (share) | gave up "
        "| admitted at first retry | engine peak streams |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {w: i for i, w in enumerate(sorted({w for w, _ in cells if w != "overload_gate"}, key=_load_key))}
    for (workload, arm), m in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), ARMS.index(kv[0][1]))):
        if workload == "overload_gate":
            continue
        load = "unloaded" if workload == "overload_unloaded" else workload[9:]
        name = label(arm, m.get("setup", setup))
        if "failed" in m or "skipped" in m:
            lines.append(f"| {load} | {name} | {m.get('failed') or m.get('skipped')} |" + " |" * 8)
            continue
        g = m.get
        lines.append(
            f"| {load} | {name} | {_f(g('offered_streams_per_s'), 1)} | {_f(g('goodput_tokens_per_s'))} "
            f"({_f(g('goodput_x_capacity'), 2)}x) | {_f(g('ttft_admitted_p50_ms'), 1)} / "
            f"{_f(g('ttft_admitted_p99_ms'), 1)} ms | {_f(g('ttft_first_try_p50_ms'))} / "
            f"{_f(g('ttft_first_try_p99_ms'))} ms | {_f(g('stream_p99_ms'))} ms | "
            f"{_f(g('rejected_429'))} / {_f(g('rejected_503'))} ({_pct(g('rejected_share_of_attempts'))}) | "
            f"{_f(g('outcome_gave_up'))} of {_f(g('requests'))} | "
            f"{_pct(g('admitted_first_retry_share'))} of {_f(g('retried_requests'))} | "
            f"{_f(g('engine_max_active'))} |"
        )
    gate = cells.get(("overload_gate", "router"), {})
    if "skipped" in gate or "failed" in gate:
        lines += ["", f"Admission gate's cost: not measured ({gate.get('skipped') or gate.get('failed')})."]
    elif "small_get_us_on" in gate:
        lines += [
            "",
            f"Admission gate's cost with nothing waiting (Python per small GET, `hotpath_cost`): "
            f"{gate['small_get_us_on']:.2f} µs with `--max-concurrent-requests 1000` against "
            f"{gate['small_get_us_off']:.2f} µs without: {gate['gate_us']:+.2f} µs.",
        ]
    return "\n".join(lines) + "\n"


def _load_key(workload: str) -> float:
    return 0.0 if workload == "overload_unloaded" else float(workload[9:-1])
