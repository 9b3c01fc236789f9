"""``drain-router-dev demo --overload``: an engine past its capacity, straight and behind a router's
admission control, on this machine.

The fake engine emulates continuous batching (``fake-model --batch-size B``: with k streams at
once each one's time per token is ``interval * max(1, k / B)``), so overload shows as it does on a
GPU: every stream slows, and a client with a timeout gives up on a stream that would have finished.
The same seeded Poisson arrivals, at :data:`LOAD` times the engine's capacity, go once straight to
the engine and once through a router with ``--max-concurrent-requests B``; the clients
(:mod:`.overload`) honour ``retry-after-ms`` and ``Retry-After`` on a refusal and try again, up to
:data:`RETRIES` times. A table compares the two runs: what the engine held at once, what completed,
the time to the first token and to the whole stream, and the refusals the router answered instead.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from drain_router_dev import cluster, overload
from drain_router_dev.load import percentile

BATCH = 8
INTERVAL_MS = 20
TOKENS = 20
PREFILL_MS = 40
LOAD = 3.0
"""Offered load, in times the engine's capacity."""
RETRIES = 3
QUEUE = 8
QUEUE_TIMEOUT_SECS = 2
SEED = 37
CAPACITY = overload.capacity_tokens_per_s(BATCH, INTERVAL_MS, TOKENS, PREFILL_MS)
"""Tokens per second the engine completes with exactly :data:`BATCH` streams at a time."""
SLO_SECS = 2.0
"""A stream that takes longer than this (about five times its unloaded length) came too late for
an interactive user: the table counts the streams that made it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Arm:
    """One run's figures, as the table shows them."""

    name: str
    requests: int
    completed: int
    on_time: int
    """Completed within :data:`SLO_SECS` of the request's arrival (its retries' waits included)."""
    tokens_per_s: float
    engine_peak: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    stream_p99_ms: float | None
    refused: int
    """Tries the router refused (429 or 503, each with when to retry)."""
    failed: int
    """Requests that never completed: cut, gave up after every retry, or still running at the end."""


def figures(name: str, requests: list[overload.Request], engine_peak: int) -> Arm:
    """One run's :class:`Arm` from its requests (pure): tokens per second over the time from the
    first arrival to the last completion."""
    done = [r for r in requests if r.outcome == "completed"]
    seconds = max((r.done for r in done if r.done is not None), default=0.0) - min(
        (r.arrival for r in requests), default=0.0
    )
    ttft = sorted(r.first_token - a.sent for r in done if (a := r.admitted) is not None and r.first_token is not None)
    whole = sorted(r.done - a.sent for r in done if (a := r.admitted) is not None and r.done is not None)

    def ms(values: list[float], q: float) -> float | None:
        value = percentile(values, q / 100, ordered=True)
        return None if value is None else value * 1000

    return Arm(
        name=name,
        requests=len(requests),
        completed=len(done),
        on_time=sum(1 for r in done if r.done is not None and r.done - r.arrival <= SLO_SECS),
        tokens_per_s=sum(r.tokens for r in done) / seconds if seconds > 0 else 0.0,
        engine_peak=engine_peak,
        ttft_p50_ms=ms(ttft, 50),
        ttft_p99_ms=ms(ttft, 99),
        stream_p99_ms=ms(whole, 99),
        refused=sum(1 for r in requests for a in r.attempts if a.status in overload.REFUSED),
        failed=len(requests) - len(done),
    )


def table(arms: list[Arm], capacity: float) -> str:
    """The comparison, one column per run."""

    def num(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:,.0f}{unit}"

    rows: list[tuple[str, list[str]]] = [
        ("requests", [str(a.requests) for a in arms]),
        ("completed", [str(a.completed) for a in arms]),
        (f"completed within {SLO_SECS:g} s", [str(a.on_time) for a in arms]),
        ("not completed", [str(a.failed) for a in arms]),
        ("refused tries (Retry-After)", [str(a.refused) for a in arms]),
        ("engine held at once (peak)", [str(a.engine_peak) for a in arms]),
        (f"tokens/s (capacity {capacity:,.0f})", [num(a.tokens_per_s) for a in arms]),
        ("first token p50", [num(a.ttft_p50_ms, " ms") for a in arms]),
        ("first token p99", [num(a.ttft_p99_ms, " ms") for a in arms]),
        ("whole stream p99", [num(a.stream_p99_ms, " ms") for a in arms]),
    ]
    width = max(len(label) for label, _ in rows)
    cols = [max(len(a.name), *(len(cells[i]) for _, cells in rows)) for i, a in enumerate(arms)]
    lines = [" " * width + "  " + "  ".join(a.name.rjust(w) for a, w in zip(arms, cols, strict=True))]
    lines.append("-" * width + "  " + "  ".join("-" * w for w in cols))
    lines += [
        label.ljust(width) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, cols, strict=True))
        for label, cells in rows
    ]
    return "\n".join(lines)


async def compare(seconds: float, progress: TextIO | None = None) -> list[Arm]:
    """Both runs on the same arrivals: straight to the engine, then through a router."""
    schedule = overload.arrivals(LOAD * CAPACITY / TOKENS, seconds, SEED)
    arms: list[Arm] = []
    with tempfile.TemporaryDirectory(prefix="drain-router-overload-") as tmp:
        async with aiohttp.ClientSession() as session:
            for name in ("no bound", "drain-router"):
                arms.append(await _arm(name, Path(tmp), session, schedule, seconds))
                if progress is not None:
                    progress.write(f"  {name}: {arms[-1].completed} of {arms[-1].requests} completed\n")
                    progress.flush()
    return arms


async def run(out: TextIO, *, seconds: float = 6.0) -> int:
    """Both runs, then the table. Exits 1 if the router let the engine hold more than its bound."""
    out.write(
        f"An engine that batches {BATCH} streams ({TOKENS} tokens, {INTERVAL_MS} ms each: about "
        f"{CAPACITY:,.0f} tokens/s) offered {LOAD:g}x that for {seconds:g} s, straight and behind a "
        f"router with --max-concurrent-requests {BATCH}...\n"
    )
    out.flush()
    arms = await compare(seconds, out)
    out.write("\n" + table(arms, CAPACITY) + "\n")
    out.write(
        "\nStraight to the engine every request is taken at once and every stream slows with the crowd, "
        f"so few finish in time; behind the router the engine never holds more than {BATCH}, what is "
        "admitted runs at full speed, and the rest wait in its queue or are told when to come back "
        "(at 3x capacity, two requests in three cannot be served in the window either way).\n"
    )
    out.flush()
    return 0 if arms[1].engine_peak <= BATCH else 1


async def _arm(name: str, log_dir: Path, session: aiohttp.ClientSession, schedule: list[float], seconds: float) -> Arm:
    model = cluster.FakeModel(
        log_dir,
        chunks=TOKENS,
        interval_ms=INTERVAL_MS,
        batch_size=BATCH,
        first_token_ms=PREFILL_MS,
        name=f"engine-{len(name)}",
    )
    router = None
    try:
        await model.start(session)
        url = model.url
        if name == "drain-router":
            limits = ("--max-concurrent-requests", str(BATCH), "--queue-size", str(QUEUE))
            router = cluster.Replica(
                "router", model.url, log_dir, extra_args=(*limits, "--queue-timeout-secs", str(QUEUE_TIMEOUT_SECS))
            )
            await router.start(session)
            url = router.url
        body: dict[str, Any] = {"model": "fake-model", "prompt": "overload", "stream": True}
        requests = await overload.drive(url + "/v1/completions", body, schedule, "honour", RETRIES, seconds * 3)
        peak = int((await model.stats(session))["max_active"])
    finally:
        if router is not None:
            router.process.kill()
        model.process.kill()
    return figures(name, requests, peak)
