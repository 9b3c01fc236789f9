"""One front process: the router's runtime (:class:`~drain_router.runtime.lifecycle.Router`: the admin
listener, signals, the drain with ``/readyz`` 503 first, the deadline) with one traffic listener whose
every request goes to the service's site (:mod:`.site`), and the watcher that keeps its pods true
(:mod:`.watch`). At closing every held request is answered 503 with ``Retry-After`` and
``Connection: close``; what is in flight runs to completion, continued streams included.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import uvloop
from prometheus_client import CollectorRegistry

from drain_router import config, kubelogin, logs, metrics
from drain_router.activator.kube import Kube
from drain_router.front.settings import FrontSettings
from drain_router.front.site import FrontSite
from drain_router.front.watch import Watcher
from drain_router.http1.listener import TrafficListener
from drain_router.runtime import lifecycle, tuning

REMEDY = kubelogin.REMEDY + ", or give --kube-api URL, or --pods"


class Front(lifecycle.Router):
    """The front process's runtime: ``await run()``, like a router's."""

    def __init__(
        self,
        cfg: config.Config,
        settings: FrontSettings,
        *,
        api: kubelogin.Access | None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(cfg, registry=registry, clock=clock)
        self.settings = settings
        self.api = api
        self.own_metrics = metrics.FrontMetrics(self.metrics.registry)
        self.site: FrontSite | None = None
        self.watcher: Watcher | None = None
        self.clock = clock

    @property
    def upstream_url(self) -> str | None:
        return self.settings.service or self.settings.pods

    async def _start_pool(self, stack: contextlib.AsyncExitStack) -> None:
        """The site (its pods and its gate) and the watcher, polling from now on."""
        site = self.site = FrontSite(
            self.settings, self.config, self.metrics, self.own_metrics, note_connect=self.state.note_connect
        )
        stack.callback(site.close)
        logs.get("drain_router.front").info(
            "front.started",
            service=self.settings.service,
            pods=self.settings.pod_urls() or None,
            continuation=site.dialect.value,
            max_continuations=self.settings.max_continuations,
            poll_interval_secs=self.settings.poll_interval_secs,
        )
        self.state.gate = site.gate  # held requests: closing answers them, /admin/inflight counts them
        kube = None
        if self.api is not None:
            kube = Kube(self.api)
            stack.push_async_callback(kube.close)
        watcher = self.watcher = Watcher(site, self.settings, kube, clock=self.clock)
        stack.push_async_callback(watcher.close)
        task = asyncio.ensure_future(watcher.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_main(self, stack: contextlib.AsyncExitStack) -> None:
        assert self.site is not None
        listener = TrafficListener(
            self.state, None, connection_limit=tuning.traffic_connection_limit(), sites=self.site
        )
        self.port = await listener.start(self.config.proxy.host, self.config.proxy.port)
        self.listener = listener
        stack.callback(listener.close)

    async def _start_grpc(self, stack: contextlib.AsyncExitStack) -> None:
        """No gRPC listener: the front relays HTTP/1.1 (OpenAI streams, WebSocket)."""


def serve(cfg: config.Config, settings: FrontSettings, *, pending_signals: Iterable[int] = ()) -> int:
    """Run a front process to completion on uvloop; returns its exit status. With ``--service``, the
    API server is ``--kube-api``, else :mod:`drain_router.kubelogin`'s; with none, one
    ``front.no_cluster`` line (where it looked, the remedy) and ``EXIT_NO_CLUSTER``."""
    tuning.raise_open_files_limit()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        api = None
        if settings.service is not None:
            try:
                api = runner.run(kubelogin.given_or_found(settings.kube_api))
            except kubelogin.NoCluster as exc:
                logs.get("drain_router.front").error("front.no_cluster", error=str(exc), remedy=REMEDY)
                return kubelogin.EXIT_NO_CLUSTER
        return runner.run(Front(cfg, settings, api=api).run(pending_signals=pending_signals))
