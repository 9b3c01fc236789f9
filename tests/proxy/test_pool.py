"""The upstream pool: idle connections are reused, and closed before the model server would close them."""

from __future__ import annotations

from drain_router.http1.upstream import pool as pool_mod
from drain_router_dev.process import wait_until
from tests import rawupstream


async def test_idle_pooled_connections_are_reused_then_closed_before_the_upstream_would(
    start_router, http, monkeypatch
):
    """Back-to-back requests share one upstream connection; once it has been idle for
    ``UPSTREAM_IDLE_SECS`` (shortened here) the router closes it itself, so a later request (a POST,
    which could not be retried) never races the model server's own keep-alive close."""
    monkeypatch.setattr(pool_mod, "UPSTREAM_IDLE_SECS", 0.3)
    async with rawupstream.running() as raw:
        r = await start_router(upstream=raw.url)
        for _ in range(3):
            async with http.get(f"{r.url}/echo") as resp:
                assert resp.status == 200
                await resp.read()
        assert raw.accepted == 1
        await wait_until(lambda: raw.closed_idle == 1, 3, "the router to close its idle pooled connection")
        async with http.post(f"{r.url}/echo", data=b"abc") as resp:
            assert resp.status == 200
            assert (await resp.json())["size"] == 3
        assert raw.accepted == 2
        assert len(r.router.pool.idle) == 1
