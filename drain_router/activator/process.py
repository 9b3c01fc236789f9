"""One activator process: the router's runtime (:class:`~drain_router.runtime.lifecycle.Router`: the
admin listener, signals, the drain with ``/readyz`` 503 first, the deadline) with the activator's
listeners, one per port of the port map (:mod:`.ports`; ``/admin/ports`` on the admin listener),
each one's requests going to its service's site (:mod:`.sites`, :mod:`.grpcsites`), and a watcher
per service (:mod:`.waking`). At closing every held request is answered 503 with ``Retry-After``
and ``Connection: close`` (a retry reaches another replica); what it forwards runs to completion, as
the router's in-flight requests do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from drain_router import config, kubelogin, logs, metrics
from drain_router.activator import kube as kube_
from drain_router.activator import ports as ports_
from drain_router.activator import waking
from drain_router.activator.kube import Kube
from drain_router.activator.settings import ActivatorSettings
from drain_router.activator.sites import ServiceSite, Sites
from drain_router.decisions import drain, websocket_close
from drain_router.decisions.websocket_close import AtClosing
from drain_router.http1.listener import TrafficListener
from drain_router.runtime import lifecycle, tuning

REMEDY = kubelogin.REMEDY + ", or give --kube-api URL"


class Activator(lifecycle.Router):
    """The activator process's runtime: ``await run()``, like a router's."""

    def __init__(
        self,
        cfg: config.Config,
        settings: ActivatorSettings,
        *,
        api: kubelogin.Access,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(cfg, registry=registry, clock=clock)
        self.settings = settings
        self.api = api
        self.configmap = ports_.configmap(settings, kube_.own_namespace())
        self.own_metrics = metrics.ActivatorMetrics(self.metrics.registry)
        self.sites: Sites | None = None
        self.kube: Kube | None = None
        self.ports: ports_.Ports | None = None
        self.clock = clock

    @property
    def upstream_url(self) -> str | None:
        return None

    def listening(self) -> bool:
        return self.ports is not None and self.admin_port is not None

    def admin_app(self) -> web.Application:
        app = super().admin_app()
        assert self.ports is not None
        ports_.install(app, self.ports)
        return app

    def close_listeners(self) -> None:
        if self.sites is not None:
            self.sites.close_queues()
        super().close_listeners()

    async def _close_listeners(self) -> None:
        await super()._close_listeners()
        if self.ports is None:
            return
        action = websocket_close.at_closing(self.config.drain.websocket_close_at)
        if action is not AtClosing.KEEP:  # (as the router's listener does with its tunnels)
            self.state.websocket_at_closing = action
            for listener in self.ports.all_listeners():
                if isinstance(listener, TrafficListener):
                    for tunnel in listener.tunnels:
                        tunnel.at_closing(action)
        self.ports.stop_accepting()

    async def grpc_closed(self, timeout: float) -> None:
        """Every port's gRPC listener closed and its connections' lingering closes ended, for at most
        ``timeout``."""
        if self.ports is not None:
            await self.ports.grpc_closed(timeout)

    async def tunnels_closed(self, timeout: float) -> None:
        """The closing handshakes of every port's WebSocket sessions (and of ports already closing)."""
        if self.ports is not None:
            waits = [
                x.tunnels.wait_closed(timeout) for x in self.ports.all_listeners() if isinstance(x, TrafficListener)
            ]
            await asyncio.gather(*waits)

    def phase_changed(self, phase: drain.Phase) -> None:
        if self.sites is not None:
            self.sites.set_leaving(self.state.closes_connections)

    def _watch(self, site: ServiceSite) -> asyncio.Task[None]:
        assert self.kube is not None
        task = asyncio.ensure_future(
            waking.watch(site, self.kube, poll_interval=self.settings.poll_interval_secs, clock=self.clock)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_admin(self, stack: contextlib.AsyncExitStack) -> None:
        """The sites and the port map first: ``/admin/ports`` answers from the admin listener's start."""
        self.kube = Kube(self.api)
        stack.push_async_callback(self.kube.close)
        self.sites = Sites(
            self.settings,
            self.config,
            self.metrics,
            self.own_metrics,
            watch=self._watch,
            note_connect=self.state.note_connect,
        )
        stack.callback(self.sites.close)
        self.state.queued = self.sites.held
        self.ports = ports_.Ports(
            self.state,
            self.settings,
            self.sites,
            self.kube,
            self.configmap,
            connection_limit=tuning.traffic_connection_limit(),
        )
        await super()._start_admin(stack)

    async def _start_pool(self, stack: contextlib.AsyncExitStack) -> None:
        """No pool of its own: each site makes its own once its service's pod is ready."""

    async def _start_main(self, stack: contextlib.AsyncExitStack) -> None:
        """The port map's poller; its listeners open as it reads the map (``activator.port_opened``)."""
        assert self.ports is not None
        stack.callback(self.ports.close)
        task = asyncio.ensure_future(self.ports.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_grpc(self, stack: contextlib.AsyncExitStack) -> None:
        """No gRPC port of its own: each ``grpc`` port of the map gets its listener (:mod:`.ports`)."""


def serve(cfg: config.Config, settings: ActivatorSettings, *, pending_signals: Iterable[int] = ()) -> int:
    """Run an activator process to completion on uvloop; returns its exit status. The API server:
    ``--kube-api``, else :mod:`drain_router.kubelogin`'s (the controller's rule); with none, one
    ``activator.no_cluster`` line (where it looked, the remedy) and ``EXIT_NO_CLUSTER``."""
    tuning.raise_open_files_limit()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            api = runner.run(kubelogin.given_or_found(settings.kube_api))
        except kubelogin.NoCluster as exc:
            logs.get("drain_router.activator").error("activator.no_cluster", error=str(exc), remedy=REMEDY)
            return kubelogin.EXIT_NO_CLUSTER
        return runner.run(Activator(cfg, settings, api=api).run(pending_signals=pending_signals))
