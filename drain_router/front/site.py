"""The one destination of every request the front takes (:class:`FrontSite`): the service's pods and
the gate requests wait at.

The gate is the activator's held queue and the router's admission in one: while no pod is a
candidate (the service scaled to zero, or every pod restarting) it has no slot, and requests wait in
arrival order (at most ``--queue-size``, for at most ``--queue-timeout-secs``); once one is, it has
``--max-concurrent-requests`` slots (no limit when 0) and the waiting requests go, oldest first. A
cut stream waiting for a pod to continue on waits here too (:meth:`FrontSite.when_ready`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from drain_router import config, logs
from drain_router.admission.gate import Gate
from drain_router.decisions.continuation import Dialect
from drain_router.front.exchange import FrontExchange, TracedFrontExchange
from drain_router.front.pods import Pod, Pods
from drain_router.front.settings import FrontSettings
from drain_router.http1.heads import Headers
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.metrics import FrontMetrics, Metrics

log = logs.get("drain_router.front")

#: The gate's slots while a pod is ready and ``--max-concurrent-requests`` is 0.
OPEN_SLOTS = 1 << 30


class FrontSite:
    """The destination and the picker of the front's listener: every request comes here, whatever it
    names (the front serves one service)."""

    refusal = None

    def __init__(
        self,
        settings: FrontSettings,
        cfg: config.Config,
        metrics: Metrics,
        own: FrontMetrics,
        *,
        note_connect: Callable[[bool], None],
    ) -> None:
        self.exchange_type = FrontExchange
        self.traced_exchange_type = TracedFrontExchange
        self.settings = settings
        self.dialect: Dialect = settings.dialect
        self.max_continuations = settings.max_continuations
        self.metrics, self.own = metrics, own
        admission = cfg.admission
        self.limit = admission.max_concurrent_requests or OPEN_SLOTS
        self.gate = Gate(0, admission.queue_size, float(admission.queue_timeout_secs), metrics=metrics)
        self.host_header = b"front"
        """``Host`` for an HTTP/1.0 request that came without one."""
        self.pods = Pods(cfg, note_connect, self.changed)
        self.waiting: dict[Callable[[bool], None], tuple[asyncio.TimerHandle, Pod | None]] = {}
        """Cut streams waiting for a candidate pod to continue on, and their timeouts."""
        self.wait_timeout = float(admission.queue_timeout_secs)
        self.loop = asyncio.get_running_loop()
        self.open = False
        self.config = cfg
        self.nowhere: UpstreamPool | None = None
        own.held.set_function(lambda: len(self.gate))

    @property
    def pool(self) -> UpstreamPool:
        """The pool of the pod a request that streams its body (or a WebSocket handshake) goes to: the
        candidate with the fewest in flight; with none, one that refuses every connection (the client
        gets 502 ``upstream_unavailable``, marked refused)."""
        pod = self.pods.pick()
        if pod is not None:
            return pod.pool
        if self.nowhere is None:
            self.nowhere = UpstreamPool(self.config, self.pods.note_connect)
        return self.nowhere

    def pick(self, headers: Headers) -> FrontSite:
        """Every request's destination: this site. The headers are not looked at."""
        return self

    def changed(self) -> None:
        """The candidates may have changed: the gate opens (the held requests go, oldest first) or
        closes (new ones wait; what is in flight goes on), and cut streams waiting for a pod go on."""
        candidates = self.pods.candidates()
        self.own.ready_pods.set(candidates)
        if candidates and not self.open:
            self.open = True
            log.info("front.forwarding", held=len(self.gate), pods=candidates)
            self.gate.resize(self.limit)
        elif not candidates and self.open:
            self.open = False
            log.info("front.holding", inflight=self.gate.active)
            self.gate.resize(0)
        if candidates:
            for resume, (timer, exclude) in list(self.waiting.items()):
                if self.pods.pick(exclude=exclude) is not None:
                    timer.cancel()
                    del self.waiting[resume]
                    resume(True)

    def when_ready(self, resume: Callable[[bool], None], exclude: Pod | None) -> None:
        """``resume(True)`` once a pod other than ``exclude`` (the pod the stream was cut on) is a
        candidate, or ``resume(False)`` after ``--queue-timeout-secs``."""

        def timed_out() -> None:
            if self.waiting.pop(resume, None) is not None:
                resume(False)

        self.waiting[resume] = (self.loop.call_later(self.wait_timeout, timed_out), exclude)

    def cancel_wait(self, resume: Callable[[bool], None]) -> None:
        waiting = self.waiting.pop(resume, None)
        if waiting is not None:
            waiting[0].cancel()

    def close(self) -> None:
        self.pods.close()
        if self.nowhere is not None:
            self.nowhere.close()
