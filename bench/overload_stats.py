"""The overload measurement's arithmetic: the engine's capacity, the arrival schedule, how long a
refused client waits, and what one cell's requests add up to. Pure: no I/O, no clock."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from bench import stats

#: A client told nothing (no ``retry-after-ms``, no ``Retry-After``) waits this long, as the fixed
#: arm always does.
FALLBACK_WAIT_SECS = 1.0
#: What a client honouring the header accepts at most (the OpenAI SDK's limit for ``retry-after-ms``).
MAX_WAIT_SECS = 60.0


def capacity_tokens_per_s(batch: int, interval_ms: float, tokens: int, prefill_ms: float = 0.0) -> float:
    """Tokens per second the engine completes with exactly ``batch`` streams at a time: each slot
    turns a stream of ``tokens`` around every ``prefill_ms + (tokens - 1) * interval_ms`` (the first
    token follows the prefill at once). About ``batch * 1000 / interval_ms`` for long streams."""
    per_stream_ms = prefill_ms + (tokens - 1) * interval_ms
    return batch * tokens * 1000.0 / per_stream_ms


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Open-loop arrival times in ``[0, seconds)``: a Poisson process of ``rate`` per second, seeded."""
    rng = random.Random(seed)
    out: list[float] = []
    at = rng.expovariate(rate)
    while at < seconds:
        out.append(at)
        at += rng.expovariate(rate)
    return out


def retry_wait(policy: str, headers: Mapping[str, str]) -> float:
    """Seconds a refused client waits before its retry. ``fixed``: always 1 s. ``honour``:
    ``retry-after-ms``, else ``Retry-After`` (seconds), else 1 s; at most :data:`MAX_WAIT_SECS`."""
    if policy == "fixed":
        return FALLBACK_WAIT_SECS
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(lowered[name]) * scale
        except (KeyError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            return min(value, MAX_WAIT_SECS)
    return FALLBACK_WAIT_SECS


@dataclasses.dataclass(slots=True)
class Attempt:
    """One try of a request: when it was sent, the status it got (None: no answer), and for a refusal
    the wait the client then chose."""

    sent: float
    status: int | None = None
    wait: float | None = None


@dataclasses.dataclass(slots=True)
class Request:
    """One client request across its tries (times in seconds from the cell's start)."""

    arrival: float
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    first_token: float | None = None
    done: float | None = None
    tokens: int = 0
    outcome: str = "unresolved"
    """``completed`` (every token and ``[DONE]``), ``gave_up`` (refused on every try), ``error``
    (cut, or another status), ``unresolved`` (still running when the cell ended)."""

    @property
    def admitted(self) -> Attempt | None:
        """The try that got a 200, if one did."""
        return next((a for a in self.attempts if a.status == 200), None)


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
