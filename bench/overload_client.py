"""The overload measurement's clients: an open-loop stream of completion requests (Poisson arrivals,
seeded), each one streaming its answer (server-sent events) and, when refused (429 or 503), waiting
as its retry policy says and trying again, a bounded number of times."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench import loadgen
from bench.overload_stats import Attempt, Request, retry_wait

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
    async with loadgen.session() as http:
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
