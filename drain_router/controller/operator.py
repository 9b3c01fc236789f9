"""Running the operator: one kopf registry, one API client, one metrics registry per run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import aiohttp
import aiohttp.web
import kopf
import structlog
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, start_http_server

from drain_router import kubelogin, logs, tracing
from drain_router.controller import context as context_
from drain_router.controller import handlers, leader
from drain_router.controller import metrics as metrics_
from drain_router.controller import settings as settings_
from drain_router.controller.kube import client as kube_
from drain_router.controller.passes import waking


def connection_from(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same Configuration our own client uses."""
    token = None
    for key in ("authorization", "BearerToken"):
        value = (configuration.api_key or {}).get(key)
        if value:
            token = value.removeprefix("Bearer ").strip()
    if not configuration.host:
        raise RuntimeError("the Kubernetes client configuration names no API server")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        token=token,
        scheme="Bearer" if token else None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


EXIT_NO_CLUSTER = kubelogin.EXIT_NO_CLUSTER
"""The exit status when there is no cluster to talk to (:mod:`drain_router.kubelogin`, the
activator's too)."""

EXIT_LEADERSHIP_LOST = 3
"""The exit status of a leader that lost the Lease (not renewed within the renew deadline, or taken
by another replica): it stops acting at once by exiting, and Kubernetes restarts it as a standby."""


async def load_configuration() -> client.Configuration:
    """The in-cluster configuration, else the kubeconfig's (:mod:`drain_router.kubelogin`, the rule
    the activator follows too); ``NoCluster`` naming why neither loads."""
    return await kubelogin.client_configuration(kubelogin.locate())


@contextlib.asynccontextmanager
async def context(
    settings: settings_.ControllerSettings,
    *,
    configuration: client.Configuration | None = None,
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[context_.Context]:
    """The shared state of one run. With an explicit ``configuration`` (tests), kopf logs in with it
    too; otherwise kopf does its own in-cluster or kubeconfig login."""
    explicit = configuration is not None
    configuration = configuration or await load_configuration()
    metrics = metrics_.ControllerMetrics(registry or CollectorRegistry())
    tracer = tracing.start("drain-router-controller", metrics.tracing_spans_dropped.inc) if settings.tracing else None
    try:
        async with client.ApiClient(configuration) as api, aiohttp.ClientSession() as session:
            yield context_.Context(
                settings=settings,
                kube=kube_.Kube(api),
                session=session,
                metrics=metrics,
                connection=connection_from(configuration) if explicit else None,
                tracer=tracer,
            )
    finally:
        if tracer is not None:
            tracer.shutdown()


async def operate(
    ctx: context_.Context, *, stop_flag: asyncio.Event | None = None, ready_flag: asyncio.Event | None = None
) -> None:
    """kopf's handlers, and beside them (with an activator) the sweep of the activator's port map,
    stopped with kopf."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry, ctx)
    sweeper = None
    if ctx.settings.activator_service is not None:
        sweeper = asyncio.create_task(
            waking.sweep_forever(ctx, logs.get("drain_router.controller")), name="activator port map sweep"
        )
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=ctx.settings.all_namespaces,
            liveness_endpoint=(
                f"http://0.0.0.0:{ctx.settings.liveness_port}/healthz" if ctx.settings.liveness_port else None
            ),
            namespaces=list(ctx.settings.namespaces),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper


def run(settings: settings_.ControllerSettings) -> int:
    """Log as the router does (JSON lines on stdout; kopf's records through the same renderer), then
    run until kopf stops (with leader election: stand by until this replica holds the Lease first).
    The exit status: 0, ``EXIT_NO_CLUSTER`` (one line with the remedy), or ``EXIT_LEADERSHIP_LOST``."""
    logs.configure(
        format=settings.log_format,
        level=settings.log_level,
        stdlib_level=settings.log_level,
        foreign=(object_fields, structlog.processors.format_exc_info),
    )
    activator = settings.activator_service
    if activator is not None and activator.ignored_suffix:
        logs.get("drain_router.controller").warning(
            "controller.deprecated_flag",
            flag="--activator-service",
            ignored=activator.ignored_suffix,
            reason="the activator's ports are assigned per service (--activator-ports); give NS/NAME only",
        )
    registry = CollectorRegistry()

    async def main() -> None:
        async with context(settings, registry=registry) as ctx:
            if settings.metrics_port:
                start_http_server(settings.metrics_port, registry=registry)
            if settings.leader_election:
                await lead(ctx)
            else:
                await operate(ctx)

    try:
        asyncio.run(main())
    except kubelogin.NoCluster as exc:
        logs.get("drain_router.controller").error("controller.no_cluster", error=str(exc), remedy=kubelogin.REMEDY)
        return EXIT_NO_CLUSTER
    return 0


async def lead(ctx: context_.Context, *, lost: Callable[[], None] | None = None) -> None:
    """Stand by until this replica holds the Lease, then run the operator while renewing it. A
    SIGTERM or SIGINT while standing by returns at once; while leading, kopf stops gracefully and the
    Lease is released after it has stopped, so a standby takes over on its next look. Losing the
    Lease calls ``lost`` (default: :func:`leadership_lost`, which ends the process)."""
    settings = ctx.settings
    log = logs.get("drain_router.controller")
    elector = leader.Elector(
        api=ctx.kube.api,
        namespace=settings.lease_namespace,
        name=settings.lease_name,
        identity=settings.identity,
        lease_duration=settings.lease_duration_secs,
        renew_deadline=settings.renew_deadline_secs,
        retry_period=settings.retry_period_secs,
        log=log,
    )
    on_lost = lost or (lambda: leadership_lost(log, settings.lease_name))
    ctx.metrics.leader.set(0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not in the main thread (tests)
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "leader.standing_by",
        lease=settings.lease_name,
        namespace=settings.lease_namespace,
        identity=settings.identity,
        takeover_bound_secs=settings.takeover_bound_secs,
    )
    async with standby_health(settings.liveness_port):
        acquired = await elector.acquire(stop)
    if not acquired:
        return
    watchdog = leader.Watchdog(elector, on_lost)
    watchdog.start()
    keeper = asyncio.create_task(elector.keep(), name="leader lease renewal")  # before kopf: kopf leaves it be

    def keeper_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and isinstance(task.exception(), leader.LeadershipLost):
            on_lost()

    keeper.add_done_callback(keeper_done)
    ctx.metrics.leader.set(1)
    kopf_ready = asyncio.Event()
    reclaim = asyncio.create_task(signals_to(stop, kopf_ready), name="leader signals")  # before kopf, as the keeper
    try:
        await operate(ctx, stop_flag=stop, ready_flag=kopf_ready)
    finally:
        reclaim.cancel()
        keeper.remove_done_callback(keeper_done)
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, leader.LeadershipLost):
            await keeper
        watchdog.stop()
        ctx.metrics.leader.set(0)
        await elector.release()


async def signals_to(stop: asyncio.Event, kopf_ready: asyncio.Event) -> None:
    """Once kopf is ready, SIGTERM and SIGINT set ``stop`` (kopf's stop flag) again.

    Why: kopf installs its own handlers at its start, replacing :func:`lead`'s. A signal then
    completes kopf's signal future, but not its task waiting on the stop flag we gave it; kopf counts
    that task as hung and waits 5 s for it before cancelling it, so the Lease was released 5 s after
    every SIGTERM. Through the stop flag, kopf's waiter ends with the signal and kopf stops at once.
    A signal during kopf's own startup (before it is ready) still goes to kopf's handler."""
    await kopf_ready.wait()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not in the main thread (tests)
            loop.add_signal_handler(sig, stop.set)


def leadership_lost(log: Any, lease: str) -> None:
    """Stop acting now: log one line and end the process with ``EXIT_LEADERSHIP_LOST`` (no cleanup,
    no kopf shutdown: those would act, and a standby may hold the Lease in a moment)."""
    log.error("leader.lost", lease=lease, exit_status=EXIT_LEADERSHIP_LOST)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


@contextlib.asynccontextmanager
async def standby_health(port: int) -> AsyncIterator[None]:
    """``GET /healthz`` answering 200 while this replica stands by (kopf serves it while leading), so
    the livenessProbe does not restart a healthy standby. Nothing when ``port`` is 0."""
    if not port:
        yield
        return
    app = aiohttp.web.Application()

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"standby": True})

    app.router.add_get("/healthz", healthz)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "0.0.0.0", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


def object_fields(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """kopf's per-object records -> ``namespace`` and ``name`` fields (kopf's own formatter prefixes
    the message with them instead)."""
    ref = getattr(event_dict.get("_record"), "k8s_ref", None)
    if isinstance(ref, dict):
        event_dict.setdefault("namespace", ref.get("namespace"))
        event_dict.setdefault("name", ref.get("name"))
    return event_dict
