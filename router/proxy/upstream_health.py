"""Polling the model server's health path: what ``/readyz`` needs besides the drain state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from router import config, logs

log = logs.get("drain_router.upstream")


async def watch(session: aiohttp.ClientSession, cfg: config.Config, report: Callable[[bool], None]) -> None:
    """Poll ``--upstream-health-path`` every ``--upstream-health-interval-secs`` until cancelled and
    ``report(up)`` each answer (logged when it changes). Any failure means "not healthy"."""
    health = cfg.health
    assert health.upstream_health_path is not None
    url = cfg.proxy.upstream.base_url + health.upstream_health_path
    interval = health.upstream_health_interval_secs
    timeout = aiohttp.ClientTimeout(total=max(interval, 1), sock_connect=cfg.proxy.upstream_connect_timeout_secs)
    last: bool | None = None
    while True:
        try:
            async with session.get(url, timeout=timeout) as resp:
                await resp.read()
                up = 200 <= resp.status < 300
        except asyncio.CancelledError:
            raise
        except Exception:
            up = False
        if up != last:
            log.info("upstream.up" if up else "upstream.down", url=url)
            last = up
        report(up)
        await asyncio.sleep(interval)
