"""One router process: signals, listeners, the upstream session, and the drain sequence.

Order, following aiohttp's graceful-shutdown steps with the Kubernetes step in front:

1. First SIGTERM (t0): state ``draining``; ``/readyz`` answers 503, every response carries
   ``Connection: close``; requests are still accepted and proxied for ``--shutdown-drain-secs``.
2. t0 + window (or a second SIGTERM): ``closing``; the main listener stops accepting and idle
   keep-alive connections are closed; in-flight streams run to completion.
3. In-flight reaches zero: ``exited`` with status 0. With a declared grace, at t0 + grace - 2 s what
   is left is aborted, counted and logged, and the process exits 1.
4. The upstream session closes, then the admin listener (so ``/admin/drain-wait`` is answered).

Transitions are decided by :func:`router.decisions.drain.next_stage`; this module only carries them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from router import config, logs, metrics
from router.decisions import drain
from router.proxy import app as app_mod
from router.proxy import health
from router.proxy.state import RouterState

log = logs.get("drain_router.lifecycle")

EXIT_STARTUP_FAILED = 2

#: How long cleanup waits for handlers after the drain decided to exit (they are done or aborted).
CLEANUP_TIMEOUT_SECS = 1.0

#: Generation-0 threshold of the cyclic garbage collector while serving (CPython's default is 700).
#: Every request allocates a few hundred container objects, so the default runs a collection every
#: couple of requests; measured in bench/, 50,000 cut CPU per small GET by ~10 % and per relayed
#: chunk by ~7 %. Reference counting still frees almost everything at once; only cycles wait longer.
GC_GEN0_THRESHOLD = 50_000

#: Descriptors kept free of client traffic for the admin listener (probes, metrics, preStop), the
#: upstream health check and the process itself; see :func:`traffic_connection_limit`.
ADMIN_RESERVE_FDS = 64

_EVENTS = {signal.SIGTERM: drain.Event.SIGTERM, signal.SIGINT: drain.Event.SIGINT}


def raise_open_files_limit() -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit: 10k streams need 20k descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    return soft, target, hard


def traffic_connection_limit(nofile_soft: int) -> int:
    """Client connections the traffic listener accepts at once: each proxied request holds two
    descriptors (client and upstream), and :data:`ADMIN_RESERVE_FDS` stay for the admin listener."""
    return max((nofile_soft - ADMIN_RESERVE_FDS) // 2, 1)


class Router:
    """The router process's runtime: build it from a :class:`~router.config.Config`, ``await run()``."""

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
        self.aborted = 0
        """Requests aborted by the deadline or a second SIGINT."""
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()
        self._started = asyncio.Event()
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._main_runner: web.ServerRunner | None = None
        self._main_site: web.TCPSite | None = None
        self._admin_runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
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
            drain_secs=self.config.drain.shutdown_drain().total_seconds(),
            now=self._clock(),
        )
        self.state.status = decision.status
        if decision.status.t0 is not None and before.t0 is None:
            self._completed_at_t0 = self.state.inflight.completed
            self._started_at_t0 = self.state.inflight.started
        inflight_before_actions = len(self.state.inflight)
        for action in decision.actions:
            self._do(action)
        if decision.status.phase != before.phase:
            self.metrics.set_state(decision.status.phase.value, drain.PHASES)
        for name in decision.events:
            self._log_event(name, event, decision, inflight_before_actions)

    def _do(self, action: drain.Action) -> None:
        loop = self._loop
        assert loop is not None
        drain_cfg = self.config.drain
        if action == drain.Action.START_WINDOW:
            self._timers.append(loop.call_later(
                drain_cfg.shutdown_drain().total_seconds(), self._apply, drain.Event.WINDOW_ELAPSED))
        elif action == drain.Action.START_DEADLINE:
            deadline = drain_cfg.deadline()
            if deadline is not None:
                self._timers.append(loop.call_later(deadline.total_seconds(), self._apply, drain.Event.DEADLINE))
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
        elif action == drain.Action.WARN_ALREADY_CLOSING:
            pass  # the drain.signal_ignored event says it
        else:  # pragma: no cover - exhaustive over Action
            raise AssertionError(action)

    def _log_event(self, name: str, event: drain.Event, decision: drain.Decision, inflight: int) -> None:
        status = decision.status
        deadline = self.config.drain.deadline()
        since_t0 = status.t0 is not None
        fields: dict[str, Any] = {
            "state": drain.EVENT_PHASE.get(name, status.phase).value,
            "signal": event.value,
            "t0": status.t0,
            "deadline": None if (deadline is None or status.t0 is None) else status.t0 + deadline.total_seconds(),
            "inflight": inflight,
            # finished since t0 (including streams already running at SIGTERM) / arrived since t0
            "served_during_drain": self.state.inflight.completed - self._completed_at_t0 if since_t0 else 0,
            "started_during_drain": self.state.inflight.started - self._started_at_t0 if since_t0 else 0,
        }
        if decision.reason is not None:
            fields["reason"] = decision.reason
        if name == "drain.start":
            fields["shutdown_drain_secs"] = self.config.drain.shutdown_drain_secs
        if name in ("drain.deadline", "drain.aborted"):
            fields["aborted"] = self.aborted
            fields["exit_code"] = status.exit_code
            log.warning(name, **fields)
        elif name == "drain.signal_ignored":
            log.warning(name, message="already closing; SIGKILL forces", **fields)
        elif name == "drain.complete":
            fields["exit_code"] = status.exit_code
            log.info(name, **fields)
        else:
            log.info(name, **fields)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_listeners(self) -> None:
        if self._main_site is not None:
            await self._main_site.stop()
            self._main_site = None
        if self._main_runner is not None and self._main_runner.server is not None:
            for conn in self._main_runner.server.connections:
                close_keepalive_connection(conn)

    # -- startup -------------------------------------------------------------------------------

    def _install_signals(self) -> Callable[[], None]:
        loop = self._loop
        assert loop is not None
        installed: list[int] = []
        for sig in _EVENTS:
            try:
                loop.add_signal_handler(sig, self.handle_exit, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
                pass

        def restore() -> None:
            for sig in installed:
                loop.remove_signal_handler(sig)

        return restore

    async def _start_admin(self) -> None:
        runner = web.AppRunner(health.make_admin_app(self.state), access_log=None,
                               shutdown_timeout=CLEANUP_TIMEOUT_SECS)
        await runner.setup()
        site = web.TCPSite(runner, self.config.admin.host, self.config.admin.port)
        await site.start()
        self._admin_runner = runner
        self.admin_port = _bound_port(site)

    async def _start_main(self) -> None:
        assert self._session is not None
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = traffic_connection_limit(soft if soft != resource.RLIM_INFINITY else 1 << 20)
        server = app_mod.make_server(self.state, self._session, connection_limit=limit)
        runner = web.ServerRunner(server, shutdown_timeout=CLEANUP_TIMEOUT_SECS)
        await runner.setup()
        self._main_runner = runner
        site = web.TCPSite(runner, self.config.proxy.host, self.config.proxy.port, backlog=4096)
        await site.start()
        self._main_site = site
        self.port = _bound_port(site)

    def _connection_limit(self) -> int | None:
        server = self._main_runner.server if self._main_runner is not None else None
        return getattr(server, "connection_limit", None)

    async def _watch_upstream(self) -> None:
        """Poll the upstream health path; the first success moves ``starting`` to ``serving``."""
        assert self._session is not None
        health = self.config.health
        assert health.upstream_health_path is not None
        url = self.config.proxy.upstream.base_url + health.upstream_health_path
        interval = health.upstream_health_interval().total_seconds()
        timeout = aiohttp.ClientTimeout(total=max(interval, 1.0),
                                        sock_connect=self.config.proxy.upstream_connect_timeout().total_seconds())
        while True:
            try:
                async with self._session.get(url, timeout=timeout) as resp:
                    await resp.read()
                    up = 200 <= resp.status < 300
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - any failure means "not healthy"
                up = False
            if up != self.state.upstream_up:
                self.state.upstream_up = up
                self.metrics.upstream_up.set(1 if up else 0)
                log.info("upstream.up" if up else "upstream.down", url=url)
            if up and self.state.status.phase == drain.Phase.STARTING:
                self._apply(drain.Event.UPSTREAM_HEALTHY)
            await asyncio.sleep(interval)

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
        restore_signals = self._install_signals() if install_signals else (lambda: None)
        try:
            for sig in pending_signals:
                self.handle_exit(sig)
            return await self._run()
        finally:
            restore_signals()

    async def _run(self) -> int:
        cfg = self.config
        advisories = config.advisories(cfg)
        self.metrics.set_config(cfg.drain.shutdown_drain_secs, cfg.drain.termination_grace_secs,
                                [a.code.value for a in advisories])
        self.metrics.set_state(self.state.status.phase.value, drain.PHASES)
        for advisory in advisories:
            log.warning("startup.advisory", **advisory.as_dict())
        try:
            if self.state.status.phase == drain.Phase.STARTING:
                await self._start_admin()
                self._session = app_mod.make_session(cfg)
            if self.state.status.phase == drain.Phase.STARTING:
                await self._start_main()
        except OSError as exc:
            log.error("startup.bind_failed", error=str(exc), host=cfg.proxy.host, port=cfg.proxy.port,
                      admin_host=cfg.admin.host, admin_port=cfg.admin.port,
                      remedy="choose free ports with --port / --admin-port")
            await self._cleanup()
            return EXIT_STARTUP_FAILED
        if self.port is not None:
            log.info("startup.listening", port=self.port, admin_port=self.admin_port,
                     connection_limit=self._connection_limit(),
                     upstream=cfg.proxy.upstream.url, shutdown_drain_secs=cfg.drain.shutdown_drain_secs,
                     termination_grace_secs=cfg.drain.termination_grace_secs)
        self._started.set()
        if self.state.status.phase == drain.Phase.STARTING:
            if cfg.health.upstream_health_path is None:
                self._apply(drain.Event.UPSTREAM_HEALTHY)
            else:
                self._spawn(self._watch_upstream())
        await self._exit.wait()
        if self.aborted:
            await self.state.inflight.wait_aborted(CLEANUP_TIMEOUT_SECS)
        await self._cleanup()
        exit_code = self.state.status.exit_code
        return drain.EXIT_CLEAN if exit_code is None else exit_code

    async def _cleanup(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._main_runner is not None:
            await self._main_runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def close_keepalive_connection(conn: web.RequestHandler) -> None:
    """Close an idle keep-alive connection now; a busy one right after its current response.

    aiohttp's own ``pre_shutdown()`` only marks connections, so an idle one stays open until cleanup
    and a pooled client keeps sending to a closed listener's pod. Idle means: waiting for the next
    request with nothing queued (aiohttp 3.14 internals; pinned, and pinned by a test).
    """
    waiter = conn._waiter  # noqa: SLF001
    if waiter is not None and not waiter.done() and not conn._messages:  # noqa: SLF001
        conn.force_close()
    else:
        conn.close()


def _bound_port(site: web.TCPSite) -> int | None:
    server = site._server  # noqa: SLF001 - aiohttp exposes the bound address only here
    sockets = getattr(server, "sockets", None) or ()
    for sock in sockets:
        return int(sock.getsockname()[1])
    return None


def serve(cfg: config.Config, *, pending_signals: Iterable[int] = ()) -> int:
    """Run a router process to completion on uvloop; returns its exit status."""
    before, soft, hard = raise_open_files_limit()
    log.info("startup.rlimit", nofile_soft_before=before, nofile_soft=soft, nofile_hard=hard)
    # Everything imported so far lives until exit: move it out of the collector's sight, so neither
    # the hot path nor the final collection at interpreter exit (measured: 110-200 ms, after the last
    # stream) walks it again.
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(Router(cfg).run(pending_signals=pending_signals))
    gc.freeze()  # what the run left behind is freed by the OS at exit, not walked by the collector
    return code
