"""One router process: listeners, the upstream session, and the drain sequence.

Order, following aiohttp's graceful-shutdown steps with the Kubernetes step in front:

1. First SIGTERM (t0): state ``draining``; ``/readyz`` answers 503, every response carries
   ``Connection: close``; requests are still accepted and proxied for ``--shutdown-drain-secs``.
2. t0 + window (or a second SIGTERM): ``closing``; the main listener stops accepting and idle
   keep-alive connections are closed; in-flight streams run to completion.
3. In-flight reaches zero: ``exited`` with status 0. With a declared grace, at t0 + grace - 2 s what
   is left is aborted, counted and logged, and the process exits 1.
4. What started is closed in reverse order (an ``AsyncExitStack``): the main listener, the upstream
   pool, then the admin listener (so ``/admin/drain-wait`` is answered).

:func:`drain_router.decisions.drain.next_stage` decides the transitions; this module carries them
out (signals, process tuning and upstream health have their own modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from drain_router import config, logs, metrics
from drain_router.decisions import drain
from drain_router.proxy import admin_listener, health, signals, tuning, upstream_health
from drain_router.proxy.grpc.listener import GrpcListener
from drain_router.proxy.listener import TrafficListener
from drain_router.proxy.pool import UpstreamPool
from drain_router.proxy.state import RouterState
from drain_router.proxy.tunnel import WEBSOCKET_CLOSE_SECS

log = logs.get("drain_router.lifecycle")

EXIT_STARTUP_FAILED = 2

#: How long cleanup waits for handlers after the drain decided to exit (they are done or aborted).
CLEANUP_TIMEOUT_SECS = 1.0

_EVENTS = {signal.SIGTERM: drain.Event.SIGTERM, signal.SIGINT: drain.Event.SIGINT}


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
        self.aborted = 0
        """Requests aborted by the deadline or a second SIGINT."""
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()
        self._started = asyncio.Event()
        self._left_starting = asyncio.Event()
        """Set when a signal ends startup: what startup waits for (the gRPC listener's connect) stops."""
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.listener: TrafficListener | None = None
        self.pool: UpstreamPool | None = None
        self._completed_at_t0 = 0
        self._started_at_t0 = 0
        self.state.inflight.on_idle(self._on_idle)

    # -- signals -------------------------------------------------------------------------------

    def handle_exit(self, sig: int) -> None:
        """Signal entry point (also called directly by tests): SIGTERM drains, SIGINT closes."""
        self._apply(_EVENTS[signal.Signals(sig)])

    def _on_idle(self) -> None:
        # Only closing reacts to the count reaching zero; skip the decision on the hot path otherwise.
        if self.state.status.phase == drain.Phase.CLOSING:
            self._apply(drain.Event.IDLE)

    # -- the decision loop ---------------------------------------------------------------------

    def _apply(self, event: drain.Event) -> None:
        before = self.state.status
        decision = drain.next_stage(
            before,
            event,
            inflight=len(self.state.inflight),
            drain_secs=self.config.drain.shutdown_drain_secs,
            now=self._clock(),
        )
        self.state.status = decision.status
        if decision.status.phase != drain.Phase.STARTING:
            self._left_starting.set()
        if decision.status.t0 is not None and before.t0 is None:
            self._completed_at_t0 = self.state.inflight.completed
            self._started_at_t0 = self.state.inflight.started
        inflight_before_actions = len(self.state.inflight)
        for action in decision.actions:
            self._do(action)
        if decision.status.phase != before.phase:
            self.metrics.set_state(decision.status.phase.value, drain.PHASES)
            if self.grpc is not None:
                self.grpc.phase_changed(decision.status.phase)
        for log_event in decision.events:
            self._log_event(log_event, event, decision, inflight_before_actions)

    def _do(self, action: drain.Action) -> None:
        loop = self._loop
        assert loop is not None
        drain_cfg = self.config.drain
        if action == drain.Action.START_WINDOW:
            self._timers.append(loop.call_later(drain_cfg.shutdown_drain_secs, self._apply, drain.Event.WINDOW_ELAPSED))
        elif action == drain.Action.START_DEADLINE:
            deadline = drain_cfg.deadline_secs()
            if deadline is not None:
                self._timers.append(loop.call_later(deadline, self._apply, drain.Event.DEADLINE))
        elif action == drain.Action.CLOSE_LISTENERS:
            self._spawn(self._close_listeners())
        elif action == drain.Action.ABORT_INFLIGHT:
            self.aborted += self.state.inflight.abort_all()
        elif action == drain.Action.EXIT:
            for timer in self._timers:
                timer.cancel()
            self.state.drained_cleanly = self.state.status.exit_code == drain.EXIT_CLEAN and self.aborted == 0
            self.state.drain_finished.set()
            self._exit.set()
        else:  # pragma: no cover - exhaustive over Action
            raise AssertionError(action)

    def _log_event(
        self, log_event: drain.LogEvent, event: drain.Event, decision: drain.Decision, inflight: int
    ) -> None:
        status = decision.status
        deadline = self.config.drain.deadline_secs()
        since_t0 = status.t0 is not None
        announced = log_event.phase
        fields: dict[str, Any] = {
            "state": (status.phase if announced is None else announced).value,
            "signal": event.value,
            "t0": status.t0,
            "deadline": None if (deadline is None or status.t0 is None) else status.t0 + deadline,
            "inflight": inflight,
            # finished since t0 (including streams already running at SIGTERM) / arrived since t0
            "served_during_drain": self.state.inflight.completed - self._completed_at_t0 if since_t0 else 0,
            "started_during_drain": self.state.inflight.started - self._started_at_t0 if since_t0 else 0,
        }
        if decision.reason is not None:
            fields["reason"] = decision.reason
        if log_event == drain.LogEvent.DRAIN_START:
            fields["shutdown_drain_secs"] = self.config.drain.shutdown_drain_secs
        elif log_event in (drain.LogEvent.DRAIN_DEADLINE, drain.LogEvent.DRAIN_ABORTED):
            fields["aborted"] = self.aborted
        elif log_event == drain.LogEvent.SIGNAL_IGNORED:
            fields["message"] = "already closing; SIGKILL forces"
        if announced == drain.Phase.EXITED:
            fields["exit_code"] = status.exit_code
        getattr(log, log_event.level)(log_event.value, **fields)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_listeners(self) -> None:
        if self.listener is not None:
            if self.config.drain.websocket_close_at == "closing":
                self.state.websocket_close_now = True
                for tunnel in self.listener.tunnels:
                    tunnel.going_away(None)
            self.listener.stop_accepting()
        if self.grpc is not None:
            self.grpc.stop_accepting()

    def _upstream_health(self, up: bool) -> None:
        if up != self.state.upstream_up:
            self.state.upstream_up = up
            self.metrics.upstream_up.set(1 if up else 0)
        if up and self.state.status.phase == drain.Phase.STARTING:
            self._apply(drain.Event.UPSTREAM_HEALTHY)

    # -- startup -------------------------------------------------------------------------------

    async def _start_admin(self, stack: contextlib.AsyncExitStack) -> None:
        runner = admin_listener.AdminRunner(
            health.make_admin_app(self.state),
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
        await listener.warm(self._left_starting)
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
        self._loop = asyncio.get_running_loop()
        # First, before anything slow: a SIGTERM during startup is honoured.
        with (
            signals.capture(self._loop, self.handle_exit, pending=pending_signals)
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
            if self.port is not None:
                log.info(
                    "startup.listening",
                    port=self.port,
                    admin_port=self.admin_port,
                    grpc_port=self.grpc_port,
                    grpc_connection_limit=self.grpc.connection_limit if self.grpc else None,
                    connection_limit=self.listener.connection_limit if self.listener else None,
                    admin_connection_limit=tuning.ADMIN_CONNECTION_LIMIT,
                    upstream=cfg.proxy.upstream.url,
                    shutdown_drain_secs=cfg.drain.shutdown_drain_secs,
                    termination_grace_secs=cfg.drain.termination_grace_secs,
                )
            stack.push_async_callback(self._cancel_tasks)  # first out: nothing runs while listeners close
            self._started.set()
            if self.state.status.phase == drain.Phase.STARTING:
                if cfg.health.upstream_health_path is None:
                    self._apply(drain.Event.UPSTREAM_HEALTHY)
                else:
                    self._spawn(upstream_health.watch(cfg, self._upstream_health))
            await self._exit.wait()
            if self.listener is not None:  # WebSocket sessions sent Close 1001: their closing handshakes
                await self.listener.tunnels.wait_closed(WEBSOCKET_CLOSE_SECS + 0.5)
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
