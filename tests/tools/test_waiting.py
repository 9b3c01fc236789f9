"""``wait_until``: the one polling loop of the tools, the tests and e2e."""

from __future__ import annotations

import time

import pytest

from drain_router_dev.process import POLL_SECS, wait_until


async def test_returns_the_first_truthy_value_and_calls_no_more() -> None:
    """A plain predicate, false twice, then a value: that value comes back, after three calls."""
    answers = iter([None, {}, {"ready": 1}, {"ready": 2}])
    calls = 0

    def check() -> dict[str, int] | None:
        nonlocal calls
        calls += 1
        return next(answers)

    assert await wait_until(check, 5, "ready") == {"ready": 1}
    assert calls == 3


async def test_an_async_predicate_is_awaited() -> None:
    seen: list[int] = []

    async def check() -> int:
        seen.append(len(seen))
        return len(seen) >= 2 and len(seen)

    assert await wait_until(check, 5, "two calls") == 2
    assert seen == [0, 1]


async def test_times_out_naming_what_and_the_last_value_seen() -> None:
    """After the timeout: ``TimeoutError`` with the timeout, ``what`` and the last value (a bare
    ``False`` is left out: it says nothing more). The predicate ran more than once in between."""
    calls = 0

    def count() -> int:
        nonlocal calls
        calls += 1
        return 0

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^timed out after 0.2s waiting for the count; last seen: 0$"):
        await wait_until(count, 0.2, "the count")
    assert 0.2 <= time.monotonic() - t0 < 1.0
    assert calls >= 0.2 / POLL_SECS / 2
    with pytest.raises(TimeoutError, match=r"^timed out after 0.1s waiting for never$"):
        await wait_until(lambda: False, timeout=0.1, what="never")


async def test_an_exception_in_the_predicate_propagates_at_once() -> None:
    """Not retried: a broken check fails on its first call, not after the timeout."""
    calls = 0

    def broken() -> bool:
        nonlocal calls
        calls += 1
        raise KeyError("state")

    t0 = time.monotonic()
    with pytest.raises(KeyError, match="state"):
        await wait_until(broken, 30, "never reached")
    assert calls == 1 and time.monotonic() - t0 < 1.0


async def test_until_decides_and_its_value_comes_back_even_if_falsy() -> None:
    """``until`` tests the value instead of its truthiness: waiting for a count to reach 0 returns
    that 0, and a timeout names the count last seen."""
    counts = iter([3, 1, 0])
    assert await wait_until(lambda: next(counts), 5, "in-flight 0", until=lambda n: n == 0) == 0
    with pytest.raises(TimeoutError, match=r"waiting for in-flight 0; last seen: 2$"):
        await wait_until(lambda: 2, 0.05, "in-flight 0", until=lambda n: n == 0)
