"""Polling the model server's health path: what ``/readyz`` needs besides the drain state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from drain_router import config, logs
from drain_router.decisions import health

log = logs.get("drain_router.upstream")


async def watch(cfg: config.Config, report: Callable[[bool], None]) -> None:
    """Poll ``--upstream-health-path`` every ``--upstream-health-interval-secs`` until cancelled and
    ``report(up)`` after each answer: up after one success, down only after
    ``--upstream-health-failure-threshold`` consecutive failures (:func:`health.judge`; logged when it
    changes). A failure is anything but a 2xx within ``--upstream-health-timeout-secs``. Its own
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
    settings = cfg.health
    assert settings.upstream_health_path is not None
    url = cfg.proxy.upstream.base_url + settings.upstream_health_path
    timeout = aiohttp.ClientTimeout(
        total=settings.upstream_health_timeout_secs, sock_connect=cfg.proxy.upstream_connect_timeout_secs
    )
    loop = asyncio.get_running_loop()
    verdict = health.Verdict()
    reported: bool | None = None
    while True:
        started = loop.time()
        ok = await _answered(session, url, timeout)
        verdict = health.judge(verdict, ok, settings.upstream_health_failure_threshold)
        if verdict.up != reported:
            log.info("upstream.up" if verdict.up else "upstream.down", url=url, failures=verdict.failures)
            reported = verdict.up
        report(verdict.up)
        await asyncio.sleep(health.next_poll_in(settings.upstream_health_interval_secs, loop.time() - started))


async def _answered(session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> bool:
    """One poll: whether the health path answered 2xx within the timeout."""
    try:
        async with session.get(url, timeout=timeout) as resp:
            await resp.read()
            return 200 <= resp.status < 300
    except asyncio.CancelledError:
        raise
    except Exception:
        return False
