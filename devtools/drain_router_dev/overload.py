"""Overload as a client sees it: the engine's capacity, an open-loop stream of completion requests
(Poisson arrivals, seeded), each streaming its answer (server-sent events) and, when refused (429 or
503), waiting as its retry policy says (the server's ``retry-after-ms``/``Retry-After``, or a fixed
second) and trying again, a bounded number of times. ``drain-router-dev demo --overload`` and the
bench's overload measurement both drive load with it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

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


REFUSED = (429, 503)


async def _stream(resp: aiohttp.ClientResponse, req: Request, now: Any) -> None:
    """Read one admitted answer: the first event's time, the token events, ``[DONE]``."""
    events, tail, done = 0, b"", False
    async for data in resp.content.iter_any():
        if req.first_token is None and b"data:" in data:
            req.first_token = now()
        joined = tail + data
        events += joined.count(b"\n\n") - tail.count(b"\n\n")
        done = done or b"[DONE]" in joined
        tail = joined[-8:]
    req.done = now()
    req.tokens = max(0, events - 1) if done else events
    req.outcome = "completed" if done else "error"


async def one(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], req: Request, policy: str, retries: int, now: Any
) -> None:
    """One client request, retried up to ``retries`` times after a refusal."""
    for tried in range(retries + 1):
        attempt = Attempt(sent=now())
        req.attempts.append(attempt)
        try:
            async with http.post(url, json=body) as resp:
                attempt.status = resp.status
                if resp.status == 200:
                    await _stream(resp, req, now)
                    return
                await resp.read()
                if resp.status not in REFUSED:
                    req.outcome = "error"
                    return
                attempt.wait = retry_wait(policy, dict(resp.headers))
        except (aiohttp.ClientError, OSError):
            req.outcome = "error"
            return
        if tried == retries:
            req.outcome = "gave_up"
            return
        await asyncio.sleep(attempt.wait)


async def drive(
    url: str,
    body: dict[str, Any],
    schedule: Sequence[float],
    policy: str,
    retries: int,
    until: float,
) -> list[Request]:
    """Send a request at each time of ``schedule`` (seconds from now), let them run until ``until``
    seconds from now (or all are done), then cancel the rest (they stay ``unresolved``)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    def now() -> float:
        return loop.time() - t0

    requests: list[Request] = []
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0, use_dns_cache=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as http:
        for at in schedule:
            delay = at - now()
            if delay > 0:
                await asyncio.sleep(delay)
            req = Request(arrival=now())
            requests.append(req)
            tasks.append(asyncio.create_task(one(http, url, body, req, policy, retries, now)))
        left = until - now()
        if tasks and left > 0:
            await asyncio.wait(tasks, timeout=left)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    return requests
