"""The overload measurement's arithmetic: what one cell's requests add up to. Pure: no I/O, no
clock. (The engine's capacity, the arrivals and the clients' waits are
:mod:`drain_router_dev.overload`'s, shared with ``drain-router-dev demo --overload``.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats
from drain_router_dev.overload import Request


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    got = stats.percentiles([v * 1000 for v in values])
    return {"p50": got["p50"], "p99": got["p99"]}


def summarize(requests: Sequence[Request], start: float, end: float, capacity: float) -> dict[str, Any]:
    """One cell's figures. Goodput counts the tokens of whole streams that ended in the window
    ``[start, end)``; every other figure counts the requests that arrived in it."""
    span = end - start
    good = sum(r.tokens for r in requests if r.outcome == "completed" and r.done is not None and start <= r.done < end)
    mine = [r for r in requests if start <= r.arrival < end]
    admitted = [(r, a) for r in mine if (a := r.admitted) is not None and r.first_token is not None]
    ttft = _ms([r.first_token - a.sent for r, a in admitted if r.first_token is not None])
    ttft_first = _ms([r.first_token - r.arrival for r, _ in admitted if r.first_token is not None])
    whole = _ms([r.done - a.sent for r, a in admitted if r.done is not None and r.outcome == "completed"])
    refusals = [a for r in mine for a in r.attempts if a.status in (429, 503)]
    retried = [r for r in mine if len(r.attempts) > 1 and r.attempts[1].status is not None]
    first_retry_ok = sum(1 for r in retried if r.attempts[1].status == 200)
    waits = [a.wait for a in refusals if a.wait is not None]
    outcomes = {k: sum(1 for r in mine if r.outcome == k) for k in ("completed", "gave_up", "error", "unresolved")}
    return {
        "requests": len(mine),
        "attempts": sum(len(r.attempts) for r in mine),
        "goodput_tokens_per_s": good / span if span > 0 else None,
        "goodput_x_capacity": good / span / capacity if span > 0 and capacity > 0 else None,
        "ttft_admitted_p50_ms": ttft["p50"],
        "ttft_admitted_p99_ms": ttft["p99"],
        "ttft_first_try_p50_ms": ttft_first["p50"],
        "ttft_first_try_p99_ms": ttft_first["p99"],
        "stream_p50_ms": whole["p50"],
        "stream_p99_ms": whole["p99"],
        "rejected_429": sum(1 for a in refusals if a.status == 429),
        "rejected_503": sum(1 for a in refusals if a.status == 503),
        "rejected_share_of_attempts": len(refusals) / max(1, sum(len(r.attempts) for r in mine)),
        "retried_requests": len(retried),
        "admitted_first_retry": first_retry_ok,
        "admitted_first_retry_share": first_retry_ok / len(retried) if retried else None,
        "retry_wait_mean_s": sum(waits) / len(waits) if waits else None,
        **{f"outcome_{k}": v for k, v in outcomes.items()},
    }
