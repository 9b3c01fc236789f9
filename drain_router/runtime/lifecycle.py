"""One router process: its listeners and the upstream pool started in order, served until the drain
ends (:mod:`.draining`, following aiohttp's graceful-shutdown steps with the Kubernetes step in
front), then what started closed in reverse order (an ``AsyncExitStack``): the main listener, the
upstream pool, then the admin listener (so ``/admin/drain-wait`` is answered).

A signal during startup skips what is left of it: the listeners are never bound. Signals, process
tuning and upstream health have their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from drain_router import config, lingering, logs, metrics, tracing
from drain_router.decisions import drain, websocket_close
from drain_router.decisions.websocket_close import AtClosing
from drain_router.grpc.listener import GrpcListener
from drain_router.http1.listener import TrafficListener
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.http1.websocket.tunnel import WEBSOCKET_CLOSE_SECS
from drain_router.runtime import admin_listener, endpoints, signals, tuning, upstream_health
from drain_router.runtime.draining import Drain
from drain_router.state import RouterState

log = logs.get("drain_router.lifecycle")

EXIT_STARTUP_FAILED = 2

#: How long cleanup waits for handlers after the drain decided to exit (they are done or aborted).
CLEANUP_TIMEOUT_SECS = 1.0


class Router:
    """The router process's runtime: build it from a :class:`~drain_router.config.Config`, ``await run()``."""

    def __init__(
        self,
        cfg: config.Config,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = cfg
        self.metrics = metrics.Metrics(registry if registry is not None else CollectorRegistry())
        self.state = RouterState(cfg, self.metrics, clock=clock)
        self.port: int | None = None
        """The bound main port (useful with ``--port 0``)."""
        self.admin_port: int | None = None
        self.grpc_port: int | None = None
        """The bound gRPC port (``--grpc-port``), None without one."""
        self.grpc: GrpcListener | None = None
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.listener: TrafficListener | None = None
        self.pool: UpstreamPool | None = None
        self.draining = Drain(cfg, self.state, self.metrics, self, clock=clock)
        if cfg.log.tracing:  # raises tracing.Unavailable without the otel extra
            self.state.tracer = tracing.start(
                "drain-router", self.metrics.tracing_spans_dropped.inc, keep_query=cfg.log.tracing_keep_query
            )

    @property
    def upstream_url(self) -> str | None:
        """Where requests go, as the startup log says it (the activator: per service, None)."""
        return self.config.proxy.upstream.url

    @property
    def aborted(self) -> int:
        """Requests aborted by the deadline or a second SIGINT."""
        return self.draining.aborted

    # -- signals and the drain ---------------------------------------------------------------

    def handle_exit(self, sig: int) -> None:
        """Signal entry point (also called directly by tests): SIGTERM drains, SIGINT closes."""
        self.draining.signal(sig)

    def close_listeners(self) -> None:
        self.state.close_queue()
        self._spawn(self._close_listeners())

    def phase_changed(self, phase: drain.Phase) -> None:
        if self.grpc is not None:
            self.grpc.phase_changed(phase)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_listeners(self) -> None:
        if self.listener is not None:
            action = websocket_close.at_closing(self.config.drain.websocket_close_at)
            if action is not AtClosing.KEEP:
                self.state.websocket_at_closing = action
                for tunnel in self.listener.tunnels:
                    tunnel.at_closing(action)
            self.listener.stop_accepting()
        if self.grpc is not None:
            self.grpc.stop_accepting()

    async def connections_closed(self) -> None:
        """After the drain, the exit's last waits, side by side so the longer one bounds them: the
        WebSocket sessions' closing handshakes (at most ``WEBSOCKET_CLOSE_SECS`` and half a second)
        and the gRPC connections' lingering closes (at most
        :data:`~drain_router.lingering.EXIT_LINGER_SECS`)."""
        await asyncio.gather(
            self.tunnels_closed(WEBSOCKET_CLOSE_SECS + 0.5), self.grpc_closed(lingering.EXIT_LINGER_SECS)
        )

    async def grpc_closed(self, timeout: float) -> None:
        """The gRPC listener closed (the final GOAWAY to each client) and its connections' lingering
        closes ended (each client's FIN), for at most ``timeout``."""
        if self.grpc is not None:
            self.grpc.close()
            await self.grpc.wait_closed(timeout)

    async def tunnels_closed(self, timeout: float) -> None:
        """After the drain: the WebSocket sessions sent Close 1001 at closing finish their closing
        handshakes, for at most ``timeout``."""
        if self.listener is not None:
            await self.listener.tunnels.wait_closed(timeout)

    def _upstream_health(self, up: bool) -> None:
        if up != self.state.upstream_up:
            self.state.upstream_up = up
            self.metrics.upstream_up.set(1 if up else 0)
        if up and self.state.status.phase == drain.Phase.STARTING:
            self.draining.apply(drain.Event.UPSTREAM_HEALTHY)

    # -- startup -------------------------------------------------------------------------------

    def admin_app(self) -> web.Application:
        """The admin listener's app (the activator adds its own endpoints to the router's)."""
        return endpoints.make_admin_app(self.state)

    def listening(self) -> bool:
        """Its traffic listeners are bound (``startup.listening`` is logged)."""
        return self.port is not None

    async def _start_admin(self, stack: contextlib.AsyncExitStack) -> None:
        runner = admin_listener.AdminRunner(
            self.admin_app(),
            metrics=self.metrics,
            connection_limit=tuning.ADMIN_CONNECTION_LIMIT,
            shutdown_timeout=CLEANUP_TIMEOUT_SECS,
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, self.config.admin.host, self.config.admin.port).start()
        self.admin_port = runner.bound_port()

    async def _start_pool(self, stack: contextlib.AsyncExitStack) -> None:
        self.pool = UpstreamPool(self.config, self.state.note_connect)
        stack.callback(self.pool.close)

    async def _start_main(self, stack: contextlib.AsyncExitStack) -> None:
        assert self.pool is not None
        limit = tuning.traffic_connection_limit()
        if self.config.grpc.port is not None:
            limit -= tuning.grpc_connection_limit(limit)
        listener = TrafficListener(self.state, self.pool, connection_limit=limit)
        self.port = await listener.start(self.config.proxy.host, self.config.proxy.port)
        self.listener = listener
        stack.callback(listener.close)

    async def _start_grpc(self, stack: contextlib.AsyncExitStack) -> None:
        grpc = self.config.grpc
        if grpc.port is None or grpc.upstream is None:
            return
        listener = GrpcListener(
            self.state,
            grpc.upstream,
            float(self.config.proxy.upstream_connect_timeout_secs),
            connection_limit=tuning.grpc_connection_limit(tuning.traffic_connection_limit()),
        )
        stack.callback(listener.close)
        await listener.warm(self.draining.left_starting)
        if self.state.status.phase != drain.Phase.STARTING:
            return  # a signal during startup: the listener is never bound, like the others
        self.grpc_port = await listener.bind(self.config.proxy.host, grpc.port)
        self.grpc = listener

    @property
    def started(self) -> asyncio.Event:
        """Set once the listeners are bound (or startup was cut short by a signal)."""
        return self._started

    async def run(self, *, pending_signals: Iterable[int] = (), install_signals: bool = True) -> int:
        """Serve until the drain finishes; return the exit status (0, 1, or 2 if startup failed).

        ``install_signals=False`` is for in-process tests, which call :meth:`handle_exit` instead.
        """
        loop = self.draining.loop = asyncio.get_running_loop()
        # First, before anything slow: a SIGTERM during startup is honoured.
        with (
            signals.capture(loop, self.handle_exit, pending=pending_signals)
            if install_signals
            else contextlib.nullcontext()
        ):
            if not install_signals:
                for sig in pending_signals:
                    self.handle_exit(sig)
            return await self._run()

    async def _run(self) -> int:
        cfg = self.config
        advisories = config.advisories(cfg)
        self.metrics.set_config(
            cfg.drain.shutdown_drain_secs, cfg.drain.termination_grace_secs, [a.code.value for a in advisories]
        )
        self.metrics.set_state(self.state.status.phase.value, drain.PHASES)
        for advisory in advisories:
            log.warning("startup.advisory", **advisory.as_dict())
        async with contextlib.AsyncExitStack() as stack:
            try:
                # A signal during startup skips the rest: the listeners are never bound.
                for start in (self._start_admin, self._start_pool, self._start_main, self._start_grpc):
                    if self.state.status.phase == drain.Phase.STARTING:
                        await start(stack)
            except OSError as exc:
                log.error(
                    "startup.bind_failed",
                    error=str(exc),
                    host=cfg.proxy.host,
                    port=cfg.proxy.port,
                    admin_host=cfg.admin.host,
                    admin_port=cfg.admin.port,
                    grpc_port=cfg.grpc.port,
                    remedy="choose free ports with --port / --admin-port / --grpc-port",
                )
                return EXIT_STARTUP_FAILED
            if self.listening():
                log.info(
                    "startup.listening",
                    port=self.port,
                    admin_port=self.admin_port,
                    grpc_port=self.grpc_port,
                    grpc_connection_limit=self.grpc.connection_limit if self.grpc else None,
                    connection_limit=self.listener.connection_limit if self.listener else None,
                    admin_connection_limit=tuning.ADMIN_CONNECTION_LIMIT,
                    upstream=self.upstream_url,
                    shutdown_drain_secs=cfg.drain.shutdown_drain_secs,
                    termination_grace_secs=cfg.drain.termination_grace_secs,
                )
            stack.push_async_callback(self._cancel_tasks)  # first out: nothing runs while listeners close
            self._started.set()
            if self.state.status.phase == drain.Phase.STARTING:
                if cfg.health.upstream_health_path is None:
                    self.draining.apply(drain.Event.UPSTREAM_HEALTHY)
                else:
                    self._spawn(upstream_health.watch(cfg, self._upstream_health))
            await self.draining.exited.wait()
            await self.connections_closed()
        if self.state.tracer is not None:
            self.state.tracer.shutdown()  # the spans of the drain exported, waiting a bounded time
        exit_code = self.state.status.exit_code
        return drain.EXIT_CLEAN if exit_code is None else exit_code

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def serve(cfg: config.Config, *, pending_signals: Iterable[int] = ()) -> int:
    """Run a router process to completion on uvloop; returns its exit status."""
    before, soft, hard = tuning.raise_open_files_limit()
    log.info("startup.rlimit", nofile_soft_before=before, nofile_soft=soft, nofile_hard=hard)
    with tuning.serving_gc(), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(Router(cfg).run(pending_signals=pending_signals))
