"""The router's shared runtime state: the in-flight set, the drain status, upstream health.

Handlers read it; only :mod:`drain_router.runtime.draining` changes the drain status (through
:func:`drain_router.decisions.drain.next_stage`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from drain_router import config, metrics, tracing
from drain_router.admission.gate import Gate
from drain_router.decisions import drain
from drain_router.decisions.websocket_close import AtClosing

#: ``/livez``'s body: the process answers, whatever its drain state.
ALIVE = {"status": "alive"}


class Request(Protocol):
    """What the in-flight count holds: a proxied request that the deadline can abort."""

    def abort_deadline(self) -> None: ...


class InFlight:
    """Exactly the proxied requests between headers parsed and last byte written, or aborted.

    A request enters when its head is parsed and leaves exactly once, on every path (completion,
    error, disconnect, deadline), so the count cannot go negative and returns to zero when traffic
    stops. Probes, metrics and admin calls never enter. The requests are kept so the deadline can
    abort exactly what is left.
    """

    __slots__ = ("_clock", "_on_idle", "_requests", "completed", "idle_since", "started")

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._requests: set[Request] = set()
        self._on_idle: Callable[[], None] | None = None
        self._clock = clock
        self.idle_since: float | None = clock()
        """Unix time the count last reached zero (process start if never busy); None while busy."""
        self.started = 0
        """Requests that have entered, for the 'started during the drain' log field."""
        self.completed = 0
        """Requests that have left, for the 'served during the drain' log field."""

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        raise NotImplementedError("use len(inflight)")

    def on_idle(self, callback: Callable[[], None]) -> None:
        self._on_idle = callback

    def enter(self, request: Request) -> None:
        self._requests.add(request)
        self.started += 1
        self.idle_since = None

    def leave(self, request: Request) -> None:
        self._requests.discard(request)
        self.completed += 1
        if not self._requests:
            self.idle_since = self._clock()
            if self._on_idle is not None:
                self._on_idle()

    def requests(self) -> list[Request]:
        """What is in flight now (a copy)."""
        return list(self._requests)

    def abort_all(self) -> int:
        """Abort every in-flight request now (each leaves the count as it is aborted); returns how many."""
        requests = list(self._requests)
        for request in requests:
            request.abort_deadline()
        return len(requests)


class RouterState:
    """What the handlers need to know about the router right now."""

    def __init__(
        self, cfg: config.Config, registry_metrics: metrics.Metrics, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = cfg
        self.metrics = registry_metrics
        self.clock = clock
        self.started_at = clock()
        self.inflight = InFlight(clock=clock)
        self._status = drain.DrainStatus()
        self.closes_connections = False
        """Every response carries ``Connection: close`` (draining on); read on the hot path."""
        self.upstream_up: bool | None = None
        """None: not checked (no health path). Otherwise the last health check's answer."""
        self._connected: bool | None = None
        self.drain_finished = asyncio.Event()
        """Set once the drain is over (clean, deadline or abort), just before exit."""
        self.drained_cleanly = False
        self.websocket_at_closing: AtClosing | None = None
        """Set at closing: what a WebSocket session opened from then on gets at once (its 1001 now,
        or watching for quiet), as ``--websocket-close-at`` says."""
        registry_metrics.track_inflight(self.inflight.__len__)
        self.tracer: tracing.Tracer | None = None
        """``--tracing``: the spans' tracer (set at startup), None when off: the one check per request."""
        self.queued: Callable[[], int] | None = None
        """What waits elsewhere than in :attr:`gate` (the activator's held requests), for
        ``/admin/inflight``; None: nothing does."""
        admission = cfg.admission
        self.gate: Gate | None = None
        """Admission control (``--max-concurrent-requests``); None without a limit (read on the hot path)."""
        if admission.max_concurrent_requests:
            self.gate = Gate(
                admission.max_concurrent_requests,
                admission.queue_size,
                float(admission.queue_timeout_secs),  # seconds, fractions allowed
                metrics=registry_metrics,
            )

    def note_connect(self, ok: bool) -> None:
        """Without a health path, ``drain_router_upstream_up`` follows the last connect to the model
        server (with one, the health check owns it). Cheap on the hot path: the gauge is set only
        when the answer changes."""
        if ok != self._connected and self.config.health.upstream_health_path is None:
            self._connected = ok
            self.metrics.upstream_up.set(1 if ok else 0)

    @property
    def status(self) -> drain.DrainStatus:
        return self._status

    @status.setter
    def status(self, status: drain.DrainStatus) -> None:
        self._status = status
        self.closes_connections = drain.closes_connections(status.phase)
        if self.gate is not None:
            self.gate.leaving = self.closes_connections

    def close_queue(self) -> None:
        """Closing: every request still waiting for a slot is refused now."""
        if self.gate is not None:
            self.gate.close()

    @property
    def phase(self) -> drain.Phase:
        return self.status.phase

    def readiness(self) -> tuple[int, dict[str, object]]:
        code, word = drain.readiness(self.status.phase, self.upstream_up)
        return code, {"status": word, "state": self.status.phase.value, "inflight": len(self.inflight)}

    def inflight_report(self) -> dict[str, object]:
        queued = 0 if self.gate is None else len(self.gate)
        if self.queued is not None:
            queued += self.queued()
        return {
            "inflight": len(self.inflight),
            "queued": queued,
            "state": self.status.phase.value,
            # A request waiting for a slot is work the router holds: not idle while any waits.
            "idle_since": None if queued else self.inflight.idle_since,
            "started_at": self.started_at,
            # Proxied requests finished since start (any outcome; probes and admin calls never count):
            # a replica that has served nothing (0) says nothing about the service's idle clock.
            "served": self.inflight.completed,
        }
