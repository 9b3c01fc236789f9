"""A real router process polling a model server whose health path answers slowly or fails:
``/readyz`` stays 200 through fewer than ``--upstream-health-failure-threshold`` consecutive
failures (error statuses and timeouts alike), turns 503 at the threshold, and one success brings it
back.

The raw upstream holds each poll until the test says how to answer it, so the router's verdict on
the polls before is read while the next one waits: no timing guesses, only deadlines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drain_router_dev.process import wait_until
from tests import rawupstream
from tests.process import RouterProcess

INTERVAL_SECS = 1
TIMEOUT_SECS = 3
"""Long enough for the test to read /readyz while a poll is held, on a loaded machine."""
LATE = TIMEOUT_SECS + 0.5
"""An answer this late is a timeout."""


@pytest.fixture
async def upstream() -> AsyncIterator[rawupstream.RawUpstream]:
    async with rawupstream.running() as up:
        yield up


@pytest.fixture
async def router(upstream: rawupstream.RawUpstream, request: pytest.FixtureRequest) -> AsyncIterator[RouterProcess]:
    threshold = getattr(request, "param", 3)
    proc = await RouterProcess.start(
        *("--upstream", upstream.url, "--port", "0", "--admin-port", "0", "--shutdown-drain-secs", "0"),
        *("--upstream-health-path", "/health", "--upstream-health-interval-secs", str(INTERVAL_SECS)),
        *("--upstream-health-timeout-secs", str(TIMEOUT_SECS)),
        *("--upstream-health-failure-threshold", str(threshold)),
    )
    try:
        await proc.wait_event("startup.listening")
        yield proc
    finally:
        await proc.kill()


async def readyz(router: RouterProcess) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{router.admin_port}/readyz") as resp:
        return resp.status, (await resp.json())["status"]


async def answer_poll(upstream: rawupstream.RawUpstream, n: int, status: int, delay: float = 0.0) -> None:
    """Wait for poll ``n`` to arrive (held), then let it answer ``status`` after ``delay`` s."""
    await wait_until(lambda: upstream.health_polls >= n, 10, f"health poll {n}")
    assert upstream.health_polls == n, "a poll went unanswered: the router polled twice at once"
    upstream.health_answers.put_nowait((delay, status))


async def verdict_before_poll(router: RouterProcess, upstream: rawupstream.RawUpstream, n: int) -> tuple[int, Any]:
    """/readyz once poll ``n`` is held: the router's verdict on polls 1 .. n - 1."""
    await wait_until(lambda: upstream.health_polls >= n, 10 + TIMEOUT_SECS, f"health poll {n}")
    return await readyz(router)


async def test_readyz_tolerates_fewer_than_threshold_failures(router, upstream):
    """threshold 3: 200, then a 503 and a timeout (2 failures: still 200), a 500 (the 3rd: 503
    upstream_unavailable), then one 200 (ready again)."""
    assert await readyz(router) == (503, "starting")
    await answer_poll(upstream, 1, 200)
    assert await verdict_before_poll(router, upstream, 2) == (200, "ready")
    await answer_poll(upstream, 2, 503)
    assert await verdict_before_poll(router, upstream, 3) == (200, "ready"), "one failure of 3"
    await answer_poll(upstream, 3, 200, delay=LATE)
    assert await verdict_before_poll(router, upstream, 4) == (200, "ready"), "a timeout is the 2nd failure of 3"
    await answer_poll(upstream, 4, 500)
    assert await verdict_before_poll(router, upstream, 5) == (503, "upstream_unavailable"), "the 3rd failure"
    await answer_poll(upstream, 5, 200)
    assert await verdict_before_poll(router, upstream, 6) == (200, "ready"), "one success brings it back"
    downs = [e for e in router.events if e.get("event") == "upstream.down"]
    assert [e["failures"] for e in downs] == [3], "logged once, when the verdict changed"


async def test_a_success_resets_the_count(router, upstream):
    """threshold 3: fail, fail, ok, fail, fail: never 3 in a row, never 503."""
    await answer_poll(upstream, 1, 200)
    for n, status in enumerate([500, 500, 200, 500, 500], start=2):
        assert await verdict_before_poll(router, upstream, n) == (200, "ready")
        await answer_poll(upstream, n, status)
    assert await verdict_before_poll(router, upstream, 7) == (200, "ready")


@pytest.mark.parametrize("router", [1], indirect=True)
async def test_threshold_one_turns_503_at_the_first_timeout(router, upstream):
    await answer_poll(upstream, 1, 200)
    assert await verdict_before_poll(router, upstream, 2) == (200, "ready")
    await answer_poll(upstream, 2, 200, delay=LATE)
    assert await verdict_before_poll(router, upstream, 3) == (503, "upstream_unavailable")
