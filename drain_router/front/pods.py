"""The service's pods as the front sees them (:class:`Pods`): each one's router (:class:`Pod`: its URL,
its upstream pool, whether it is ready and whether it is leaving), and the choice of the pod a
request goes to (:func:`~drain_router.decisions.front.least_loaded`).

A pod is a candidate while its router's last probe answered ready and it has not said it is
leaving since: its first ``Connection: close`` (:meth:`Pod.leave`, from an answer relayed through
it) takes it out at once, before any probe or endpoint update; only a probe sent after that makes
it a candidate again (a router that closed a connection for another reason and still answers ready).
A pod that leaves the list keeps its pool until what it carries has finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable

from drain_router import config, logs
from drain_router.decisions import front
from drain_router.http1.upstream.pool import UpstreamPool

log = logs.get("drain_router.front")


class Pod:
    """One pod's router."""

    __slots__ = ("left_at", "pool", "ready", "url")

    def __init__(self, url: str, pool: UpstreamPool) -> None:
        self.url = url
        self.pool = pool
        self.ready = False
        """Its router's last ``/readyz`` answered 200."""
        self.left_at: float | None = None
        """Loop time of its router's last ``Connection: close`` (None: none since its last ready probe)."""

    @property
    def inflight(self) -> int:
        """Requests on its connections now (one each: HTTP/1.1), those being connected included."""
        return self.pool.open - len(self.pool.idle)

    @property
    def candidate(self) -> bool:
        return self.ready and self.left_at is None

    def leave(self, now: float) -> None:
        if self.left_at is None:
            log.info("front.pod_leaving", pod=self.url, inflight=self.inflight)
        self.left_at = now

    def probed(self, ready: bool, sent_at: float) -> None:
        """A probe sent at ``sent_at`` answered: ready clears a leaving mark older than the probe."""
        self.ready = ready
        if ready and self.left_at is not None and self.left_at < sent_at:
            self.left_at = None


class Pods:
    """The pods of the service, by URL, and the choice among them."""

    def __init__(self, cfg: config.Config, note_connect: Callable[[bool], None], on_change: Callable[[], None]) -> None:
        self.config = cfg
        self.note_connect = note_connect
        self.on_change = on_change
        """Called when the candidates may have changed (the site opens or closes its gate)."""
        self.pods: dict[str, Pod] = {}
        self.gone: list[Pod] = []
        """Pods no longer listed whose pools still carry requests (closed once idle)."""
        self.turn = 0
        self.loop = asyncio.get_running_loop()

    def candidates(self) -> int:
        return sum(1 for pod in self.pods.values() if pod.candidate)

    def by_pool(self, pool: UpstreamPool) -> Pod | None:
        for pod in (*self.pods.values(), *self.gone):
            if pod.pool is pool:
                return pod
        return None

    def pick(self, exclude: Pod | None = None) -> Pod | None:
        """The candidate with the fewest requests in flight (``exclude`` only when it is the only one
        left is it still skipped: a retry or a continuation goes elsewhere or nowhere)."""
        pods = list(self.pods.values())
        loads = [pod.inflight if pod.candidate and pod is not exclude else None for pod in pods]
        index = front.least_loaded(loads, self.turn)
        self.turn += 1
        return None if index is None else pods[index]

    def set_urls(self, urls: Iterable[str]) -> None:
        """The pods listed now: new ones are added (not ready until probed), those gone are dropped
        (their requests finish on their pools)."""
        wanted = list(dict.fromkeys(urls))
        for url in wanted:
            if url not in self.pods:
                upstream = config.parse_upstream(url)
                cfg = dataclasses.replace(self.config, proxy=dataclasses.replace(self.config.proxy, upstream=upstream))
                self.pods[url] = Pod(url, UpstreamPool(cfg, self.note_connect))
                log.info("front.pod_added", pod=url)
        for url in [u for u in self.pods if u not in wanted]:
            pod = self.pods.pop(url)
            log.info("front.pod_removed", pod=url, inflight=pod.inflight)
            self.gone.append(pod)
        self.sweep()
        self.on_change()

    def probed(self, results: Iterable[tuple[str, bool]], sent_at: float) -> None:
        for url, ready in results:
            pod = self.pods.get(url)
            if pod is not None:
                was = pod.candidate
                pod.probed(ready, sent_at)
                if pod.candidate != was:
                    log.info("front.pod_ready" if pod.candidate else "front.pod_not_ready", pod=url)
        self.on_change()

    def leave(self, pod: Pod) -> None:
        was = pod.candidate
        pod.leave(self.loop.time())
        if was:
            self.on_change()

    def sweep(self) -> None:
        for pod in [p for p in self.gone if not p.pool.open]:
            self.gone.remove(pod)
            pod.pool.close()

    def close(self) -> None:
        for pod in (*self.pods.values(), *self.gone):
            pod.pool.close()
