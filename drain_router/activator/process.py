"""One activator process: the router's runtime (:class:`~drain_router.runtime.lifecycle.Router`: the
admin listener, signals, the drain with ``/readyz`` 503 first, the deadline) with the activator's
traffic listener, whose requests go to one destination per service (:class:`~.sites.Sites`), its
gRPC listener with ``--grpc-port`` (each call's destination its service's, :mod:`.grpcsites`), and
a watcher per service with requests (:mod:`.waking`). At closing every held request is answered
503 with ``Retry-After`` and ``Connection: close`` (a retry reaches another replica); what it
forwards runs to completion, as the router's in-flight requests do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import uvloop
from prometheus_client import CollectorRegistry

from drain_router import config, metrics
from drain_router.activator import grpcsites, waking
from drain_router.activator.kube import Kube
from drain_router.activator.settings import ActivatorSettings
from drain_router.activator.sites import ServiceSite, Sites
from drain_router.decisions import drain
from drain_router.grpc.listener import GrpcListener
from drain_router.http1.listener import TrafficListener
from drain_router.runtime import lifecycle, tuning


class Activator(lifecycle.Router):
    """The activator process's runtime: ``await run()``, like a router's."""

    def __init__(
        self,
        cfg: config.Config,
        settings: ActivatorSettings,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(cfg, registry=registry, clock=clock)
        self.settings = settings
        self.own_metrics = metrics.ActivatorMetrics(self.metrics.registry)
        self.sites: Sites | None = None
        self.kube: Kube | None = None
        self.clock = clock

    @property
    def upstream_url(self) -> str | None:
        return None

    def close_listeners(self) -> None:
        if self.sites is not None:
            self.sites.close_queues()
        super().close_listeners()

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

    async def _start_pool(self, stack: contextlib.AsyncExitStack) -> None:
        self.kube = Kube(self.settings.kube_api)
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

    async def _start_main(self, stack: contextlib.AsyncExitStack) -> None:
        limit = tuning.traffic_connection_limit()
        if self.settings.grpc_port is not None:
            limit -= tuning.grpc_connection_limit(limit)  # (the gRPC listener's share, as the router's)
        listener = TrafficListener(self.state, None, connection_limit=limit, sites=self.sites)
        listener.exempt_paths = frozenset()  # every request of a sleeping service is held
        self.port = await listener.start(self.config.proxy.host, self.config.proxy.port)
        self.listener = listener
        stack.callback(listener.close)

    async def _start_grpc(self, stack: contextlib.AsyncExitStack) -> None:
        """``--grpc-port``: the router's gRPC listener, each call's destination its service's site."""
        if self.settings.grpc_port is None:
            return
        assert self.sites is not None
        picker = grpcsites.GrpcSites(self.sites)
        listener = GrpcListener(
            self.state,
            None,
            float(self.config.proxy.upstream_connect_timeout_secs),
            connection_limit=tuning.grpc_connection_limit(tuning.traffic_connection_limit()),
            sites=picker,
        )
        picker.listener = listener
        stack.callback(listener.close)
        self.grpc_port = await listener.bind(self.config.proxy.host, self.settings.grpc_port)
        self.grpc = listener


def serve(cfg: config.Config, settings: ActivatorSettings, *, pending_signals: Iterable[int] = ()) -> int:
    """Run an activator process to completion on uvloop; returns its exit status."""
    tuning.raise_open_files_limit()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(Activator(cfg, settings).run(pending_signals=pending_signals))
