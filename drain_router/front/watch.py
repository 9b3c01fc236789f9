"""Keeping the front's list of pods true (:class:`Watcher`): every ``--poll-interval-secs``, the pods
are listed (``--pods`` as given, or with ``--service`` the ready endpoints of the ModelService's
Services' EndpointSlices, the activator's left out: :func:`~drain_router.decisions.front.endpoints`)
and each one's router probed (``/readyz`` on its traffic port: 200 is ready). While requests are held
and no pod is ready, a wake is asked for on the ModelService's status (``wakeRequestedAt``, as the
activator asks: :func:`~drain_router.decisions.activator.should_request_wake`).

An API call or a probe that gets no answer is logged (rate-limited) and tried again at the next poll:
the last list stands meanwhile, and a pod that does not answer its probe is not ready.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from drain_router import logs
from drain_router.activator.kube import Kube, Unanswered
from drain_router.decisions import activator, front
from drain_router.front.settings import FrontSettings
from drain_router.front.site import FrontSite

log = logs.get("drain_router.front")

PROBE_TIMEOUT_SECS = 1.0


class Watcher:
    def __init__(
        self,
        site: FrontSite,
        settings: FrontSettings,
        kube: Kube | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.site = site
        self.settings = settings
        self.kube = kube
        self.clock = clock
        self.urls: list[str] = settings.pod_urls()
        self.modelservice: dict[str, Any] | None = None
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECS))
        self.unanswered = logs.RateLimited(log, "front.api_unanswered", level="warning")
        self.polled = asyncio.Event()
        """Set after each poll (tests wait for it)."""

    async def close(self) -> None:
        await self.session.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sent = loop.time()
            try:
                await self.poll(sent)
            except Exception as exc:  # logged and tried again: the front keeps serving what it knows
                log.error("front.poll_failed", error=repr(exc))
            self.polled.set()
            await asyncio.sleep(self.settings.poll_interval_secs)

    async def poll(self, sent: float) -> None:
        if self.kube is not None:
            await self._list()
        pods = self.site.pods
        pods.set_urls(self.urls)
        ready = await asyncio.gather(*(self._probe(url) for url in self.urls))
        pods.probed(zip(self.urls, ready), sent)
        if self.kube is not None and len(self.site.gate) and not pods.candidates():
            await self._wake()

    async def _probe(self, url: str) -> bool:
        try:
            async with self.session.get(url + "/readyz") as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _list(self) -> None:
        """The ModelService, then its Services' EndpointSlices: :attr:`urls` (kept as they were when
        a call gets no answer)."""
        assert self.kube is not None
        namespace, name = self.settings.service_ref()
        try:
            code, obj = await self.kube.get_modelservice(namespace, name)
            if code != 200 or not isinstance(obj, dict):
                self.unanswered.emit(call="get modelservice", status=code)
                return
            self.modelservice = obj
            port = activator.router_port(obj.get("spec") or {})
            found: list[front.Endpoint] = []
            services = front.service_names(obj)
            for service in services:
                code, listed = await self.kube.list_endpointslices(namespace, service)
                if code != 200 or not isinstance(listed, dict):
                    self.unanswered.emit(call="list endpointslices", status=code)
                    return
                found += front.endpoints(listed.get("items") or [], services)
        except Unanswered as exc:
            self.unanswered.emit(call="kube", error=str(exc))
            return
        self.urls = [endpoint.url(port) for endpoint in found if endpoint.ready]

    async def _wake(self) -> None:
        """Ask for a wake (at most one patch a poll), as the activator does."""
        assert self.kube is not None
        obj = self.modelservice
        if obj is None:
            return
        status = activator.activation_status(obj.get("status"))
        if not activator.should_request_wake(status, len(self.site.gate)):
            return
        namespace, name = self.settings.service_ref()
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        try:
            code, _ = await self.kube.patch_status(namespace, name, activator.wake_patch(self.clock(), version))
        except Unanswered as exc:
            self.unanswered.emit(call="patch status", error=str(exc))
            return
        if code == 200:
            log.info("front.wake_requested", service=self.settings.service, resource_version=version)
        else:
            log.info("front.wake_not_written", service=self.settings.service, status=code)
