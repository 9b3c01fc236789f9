"""The fake model's capacity (``--batch-size``): continuous batching, where each stream's token rate
falls once more streams generate at once than the batch holds; and ``max_active`` in /stats, the peak
of concurrent streams. The rate function is a table; the rest is black-box over HTTP, timed by the
chunks' arrival. Sleeps only stretch, never shorten, so the bounds that must hold on a loaded machine
are lower bounds; each upper bound leaves the measured figure a wide margin."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drain_router_dev import fake_model, streams
from drain_router_dev.fake_model import capacity, testing
from drain_router_dev.process import wait_until


@pytest.mark.parametrize(
    ("interval", "streams_now", "batch", "expected"),
    [
        pytest.param(50, 1, 0, 50, id="no-limit-one-stream"),
        pytest.param(50, 1000, 0, 50, id="no-limit-many-streams"),
        pytest.param(50, 1, 4, 50, id="under-the-batch"),
        pytest.param(50, 4, 4, 50, id="a-full-batch-keeps-the-pace"),
        pytest.param(50, 5, 4, 62.5, id="one-past-the-batch"),
        pytest.param(50, 8, 4, 100, id="twice-the-batch-half-the-rate"),
        pytest.param(40, 3, 1, 120, id="batch-of-one"),
        pytest.param(0, 9, 3, 0, id="no-interval-stays-none"),
    ],
)
def test_token_interval(interval: int, streams_now: int, batch: int, expected: float) -> None:
    assert capacity.token_interval_ms(interval, streams_now, batch) == pytest.approx(expected)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Stream:
    """One streamed completion read as it comes: the arrival time of each chunk."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.decoder = streams.SSEDecoder()
        self.pending: list[str] = []
        self.times: list[float] = []
        self.done = False

    async def next_chunk(self) -> float:
        """Read up to the next chunk (or the end); its arrival time."""
        while not self.pending:
            data = await self.response.content.readany()
            assert data, "the stream ended early"
            self.pending.extend(self.decoder.feed(data))
        event = self.pending.pop(0)
        if event == "[DONE]":
            self.done = True
        else:
            assert json.loads(event)["seq"] == len(self.times)
            self.times.append(time.monotonic())
        return time.monotonic()

    async def finish(self) -> list[float]:
        while not self.done:
            await self.next_chunk()
        return self.times


async def _open(http: aiohttp.ClientSession, url: str, chunks: int, interval_ms: int) -> Stream:
    """A streamed completion, with its first chunk read (it comes at once: the stream is then
    generating, and in the batch)."""
    body = {"stream": True, "chunks": chunks, "interval_ms": interval_ms}
    stream = Stream(await http.post(url + "/v1/completions", json=body))
    await stream.next_chunk()
    return stream


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def _stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/stats") as resp:
        return dict(await resp.json())


@pytest.mark.parametrize(("batch", "slowed"), [(2, True), (0, False)], ids=["batch-of-two", "no-limit"])
async def test_streams_past_the_batch_slow_down(http: aiohttp.ClientSession, batch: int, slowed: bool) -> None:
    """1. four streams of 6 chunks, 200 ms apart, all generating at once.
    Result: with a batch of two each gap is 200 ms * 4 / 2 = 400 ms; without a limit, 200 ms."""
    async with testing.running(fake_model.Settings(batch_size=batch)) as model:
        opened = [await _open(http, model.url, 6, 200) for _ in range(4)]
        runs = await asyncio.gather(*(s.finish() for s in opened))
    durations = sorted(times[-1] - times[0] for times in runs)
    # The first to finish ran its five gaps with four streams generating, but for the moments the
    # others took to open (the later ones gain speed from the moment it left): about 5 x 400 ms.
    if slowed:
        assert durations[0] >= 5 * 0.400 * 0.9, durations
    else:
        # 1 s expected. The bound leaves a busy machine 140 ms of lateness a gap (a wall clock only
        # ever runs late) and still tells an unlimited batch from a batch of two (2 s).
        assert durations[-1] < 5 * 0.400 * 0.85, durations


async def test_the_rate_is_recomputed_as_streams_join_and_leave(http: aiohttp.ClientSession) -> None:
    """Batch of one. 1. a long stream L (600 ms a token) has sent its first chunk 2. a short stream S
    (150 ms a token, 2 chunks) joins at once: both are slowed 2x, so S's one gap takes 300 ms, in which
    L makes a quarter of its token 3. S ends: L finishes the other three quarters alone, in 450 ms.
    Result: L's gap is 750 ms. Had the join not been seen it would be 600 ms; had the leave not been
    seen, 1200 ms."""
    async with testing.running(fake_model.Settings(batch_size=1)) as model:
        long = await _open(http, model.url, 2, 600)
        short = await _open(http, model.url, 2, 150)
        short_times, long_times = await asyncio.gather(short.finish(), long.finish())
    assert _gaps(short_times)[0] >= 0.300 * 0.97
    assert 0.690 <= _gaps(long_times)[0] <= 1.0, long_times


async def test_a_client_that_leaves_frees_its_place_in_the_batch(http: aiohttp.ClientSession) -> None:
    """Batch of one. 1. two streams generate (each 2x slower) 2. one client leaves mid-stream.
    Result: the other's gaps return to 100 ms (the server counts the leaver cancelled)."""
    async with testing.running(fake_model.Settings(batch_size=1)) as model:
        stay = await _open(http, model.url, 8, 100)
        leave = await _open(http, model.url, 1000, 100)
        await stay.next_chunk()  # a gap with both in the batch
        leave.response.close()
        while (await _stats(http, model.url))["cancelled"] != 1:
            await stay.next_chunk()  # the server has not seen the leaver yet: wait for the next token
        await stay.next_chunk()  # the gap that may still have begun with the leaver in the batch
        left = len(stay.times)
        times = await stay.finish()
    alone = _gaps(times[left - 1 :])
    assert alone and max(alone) < 0.100 * 1.7, alone


async def test_a_non_streamed_completion_shares_the_batch(http: aiohttp.ClientSession) -> None:
    """Batch of one. 1. a stream of 20 chunks (100 ms apart) generates 2. a non-streamed completion of
    3 tokens (100 ms) is asked meanwhile. Result: it takes at least 3 x 200 ms."""
    async with testing.running(fake_model.Settings(batch_size=1)) as model:
        background = await _open(http, model.url, 20, 100)
        began = time.monotonic()
        async with http.post(model.url + "/v1/completions", json={"chunks": 3, "interval_ms": 100}) as resp:
            assert resp.status == 200
            await resp.read()
        took = time.monotonic() - began
        background.response.close()
    assert took >= 3 * 0.200 * 0.97, took


async def test_max_active_is_the_peak_of_concurrent_streams(http: aiohttp.ClientSession) -> None:
    """1. one stream, to its end 2. three at once, until their clients leave 3. one more. Result:
    ``max_active`` is 3 (not the 5 started, not the 1 of the last, not the 0 active now)."""

    async def ended() -> dict[str, Any]:
        """/stats once the server has counted every stream's end (a client reads ``[DONE]`` a moment
        before the server's handler returns)."""
        return await wait_until(lambda: _stats(http, model.url), 5, "no active stream", until=lambda s: not s["active"])

    async with testing.running(fake_model.Settings(chunks=2, interval_ms=1)) as model:
        await (await _open(http, model.url, 2, 1)).finish()
        assert (await ended())["max_active"] == 1
        opened = [await _open(http, model.url, 1000, 100) for _ in range(3)]  # all three still running
        assert (await _stats(http, model.url))["max_active"] == 3
        for stream in opened:
            stream.response.close()  # the clients leave: counted cancelled
        await ended()
        await (await _open(http, model.url, 2, 1)).finish()
        stats = await ended()
    assert (stats["started"], stats["active"], stats["max_active"]) == (5, 0, 3)


def test_the_command_takes_a_batch_size() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "drain_router_dev", "fake-model", "--port", "0", "--batch-size", "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        event = json.loads(proc.stdout.readline())
        assert (event["event"], event["batch_size"]) == ("fake_model.listening", 4)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
