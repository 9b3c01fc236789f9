"""Polling the model server's health path: what ``/readyz`` needs besides the drain state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from drain_router import config, logs

log = logs.get("drain_router.upstream")


async def watch(cfg: config.Config, report: Callable[[bool], None]) -> None:
    """Poll ``--upstream-health-path`` every ``--upstream-health-interval-secs`` until cancelled and
    ``report(up)`` each answer (logged when it changes). Any failure means "not healthy". Its own
    aiohttp session: the traffic path's pool is for traffic."""
    upstream = cfg.proxy.upstream
    connector: aiohttp.BaseConnector
    if upstream.unix_path is not None:
        connector = aiohttp.UnixConnector(path=upstream.unix_path, limit=1)
    else:
        connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        await _poll(session, cfg, report)


async def _poll(session: aiohttp.ClientSession, cfg: config.Config, report: Callable[[bool], None]) -> None:
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
