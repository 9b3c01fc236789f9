"""Recycling and lifecycle rules: one ``@kopf.daemon`` loop per ModelService that has either.

Each turn is a recycling pass, then a lifecycle pass, then a sleep until the earlier of their requeue
times (at most ``max_sleep_secs``). The daemon does nothing while ``spec.suspend`` or a
deletionTimestamp is set and never raises into kopf: every expected API answer is data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from drain_router.controller import context
from drain_router.controller import status as status_
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.controller.kube import workload as workload_
from drain_router.controller.passes import lifecycle_pass, recycle_pass
from drain_router.controller.passes import turn as turn_
from drain_router.decisions import deletion, spans

MIN_SLEEP_SECS = 0.05
"""The daemon's shortest sleep, so a requeue time already past never spins the loop."""

#: Kubernetes API failures a daemon pass survives (logged, retried after the standard requeue).
_API_FAILURES = (ApiException, kube_.CallFailed, aiohttp.ClientError, asyncio.TimeoutError)


async def service_loop(ctx: context.Context, namespace: str, name: str, stopped: Any, logger: Any) -> None:
    """Pass, sleep until the pass's requeue time (``stopped.wait``: returns at once on deletion or
    operator exit), repeat. Never raises into kopf: an unexpected error is logged and retried after
    the standard requeue."""
    while not stopped:
        try:
            delay = await service_pass(ctx, namespace, name, logger)
        except _API_FAILURES as exc:
            logger.warning(f"recycling/lifecycle pass failed, retried in {ctx.settings.requeue_secs:g}s: {exc}")
            delay = ctx.settings.requeue_secs
        except Exception as exc:
            logger.exception(f"recycling/lifecycle pass crashed, retried in {ctx.settings.requeue_secs:g}s: {exc}")
            delay = ctx.settings.requeue_secs
        if delay is None:
            ctx.wakeups.pop((namespace, name), None)
            return
        await sleep(ctx.wakeup(namespace, name), stopped, min(max(delay, MIN_SLEEP_SECS), ctx.settings.max_sleep_secs))


async def sleep(woken: asyncio.Event, stopped: Any, seconds: float) -> None:
    """Until ``seconds`` have passed, the daemon is stopped, or ``woken`` is set (a wake was asked
    for: the next pass runs at once instead of after the requeue time)."""
    if woken.is_set():
        woken.clear()
        return

    async def stop() -> None:
        await stopped.wait(seconds)

    tasks = {asyncio.ensure_future(stop()), asyncio.ensure_future(woken.wait())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        woken.clear()


async def service_pass(ctx: context.Context, namespace: str, name: str, logger: Any) -> float | None:
    """One recycling pass, then one lifecycle pass. Returns the seconds to sleep, ``None`` when the
    ModelService is gone."""
    fresh: Mapping[str, Any] | None = await ctx.kube.get_modelservice(namespace, name)
    if fresh is None:
        ctx.metrics.forget_recycling(namespace, name)
        return None
    if fresh["metadata"].get("deletionTimestamp") or (fresh.get("spec") or {}).get("suspend"):
        return ctx.settings.max_sleep_secs  # the staged deletion owns it now, or a person said hold
    spec = observe.service_spec(fresh.get("spec") or {})
    workload = await workload_.observe_workload(ctx.kube, fresh, spec)
    for failure in workload.failures:
        logger.warning(f"read failed, recycling and lifecycle rules wait for the next pass: {failure}")
    context.warn_not_owned(ctx, fresh, workload.not_owned, logger)
    report = [str(n) for n in workload.not_owned][: deletion.MAX_LISTED_PODS] or None
    if not workload.failures and (fresh.get("status") or {}).get("notOwned") != report:
        fresh, _ = await status_.write_status(ctx, fresh, lambda _: {"notOwned": report}, logger)
    requeues: list[float] = []
    session = ctx.session
    owned = session is None
    if session is None:
        session = aiohttp.ClientSession()
    try:
        turn = turn_.Turn(ctx=ctx, workload=workload, session=session, logger=logger)
        with ctx.span(spans.RECYCLE_PASS, fresh):
            fresh, at = await recycle_pass.run(turn, fresh)
        requeues.append(at)
        with ctx.span(spans.LIFECYCLE_PASS, fresh):
            fresh, at = await lifecycle_pass.run(turn, fresh)
        requeues.append(at)
    finally:
        if owned:
            await session.close()
    return min(requeues) - ctx.clock()
