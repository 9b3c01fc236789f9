"""The streaming load, against the fake model's testing kit in this loop."""

from __future__ import annotations

import itertools

import aiohttp
import pytest

from drain_router_dev import load, streams
from drain_router_dev.fake_model import testing
from drain_router_dev.process import wait_until


async def test_staggered_clients_arrive_spread_over_one_stream() -> None:
    """1. four staggered clients stream 0.2 s completions 2. wait for eight finished. Result: their
    first requests started about 50 ms apart (0.2 s / 4), not all at once; none lost."""
    async with testing.running() as model:
        stream_load = load.Load(model.url, clients=4, chunks=5, interval_ms=50, stagger=True)
        await stream_load.start()

        try:
            await wait_until(lambda: len(stream_load.records), 5, "eight finished streams", until=lambda n: n >= 8)
        finally:
            records = await stream_load.stop()
    firsts = sorted(r.started for r in records)[:4]
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert all(0.03 < gap < 0.15 for gap in gaps), gaps
    assert not stream_load.lost


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_whole_stream_is_ok_on_both_paths(path: str) -> None:
    """The chat stream's role chunk is counted: a whole chat stream is not taken for a bad one."""
    async with testing.running() as model, aiohttp.ClientSession() as session:
        result = await load.stream_completion(session, model.url, chunks=4, interval_ms=1, path=path)
    assert streams.classify(result) is streams.Outcome.OK, result
