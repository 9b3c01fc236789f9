"""The drain sequence, carried out: :func:`drain_router.decisions.drain.next_stage` decides each
transition (a signal, the window or the deadline elapsing, in-flight reaching zero, the model
server first healthy); :class:`Drain` applies it. Its actions: the window's and the deadline's
timers, the listeners told to close (through :class:`Process`), what is still in flight aborted,
the exit; and each transition's log line, with what was served and started since the first
SIGTERM.

1. First SIGTERM (t0): state ``draining``; ``/readyz`` answers 503, every response carries
   ``Connection: close``; requests are still accepted and proxied for ``--shutdown-drain-secs``.
2. t0 + window (or a second SIGTERM): ``closing``; the main listener stops accepting and idle
   keep-alive connections are closed; in-flight streams run to completion.
3. In-flight reaches zero: ``exited`` with status 0. With a declared grace, at t0 + grace - 2 s what
   is left is aborted, counted and logged, and the process exits 1.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

from drain_router import config, logs, metrics, tracing
from drain_router.decisions import drain, spans
from drain_router.state import RouterState

log = logs.get("drain_router.lifecycle")

_EVENTS = {signal.SIGTERM: drain.Event.SIGTERM, signal.SIGINT: drain.Event.SIGINT}


class Process(Protocol):
    """The router process, as the drain acts on its listeners."""

    def close_listeners(self) -> None:
        """Closing: stop accepting; open WebSocket tunnels get Close 1001 now or once quiet, as
        ``--websocket-close-at`` says."""

    def phase_changed(self, phase: drain.Phase) -> None: ...


class Drain:
    """The drain status of one router process, moved only by :meth:`apply`."""

    def __init__(
        self,
        cfg: config.Config,
        state: RouterState,
        registry_metrics: metrics.Metrics,
        process: Process,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = cfg
        self.state = state
        self.metrics = registry_metrics
        self.process = process
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop the timers run on (set once the process runs)."""
        self.aborted = 0
        """Requests aborted by the deadline or a second SIGINT."""
        self.exited = asyncio.Event()
        self.left_starting = asyncio.Event()
        """Set when a signal ends startup: what startup waits for (the gRPC listener's connect) stops."""
        self._clock = clock
        self._timers: list[asyncio.TimerHandle] = []
        self._completed_at_t0 = 0
        self._started_at_t0 = 0
        state.inflight.on_idle(self._on_idle)

    def signal(self, sig: int) -> None:
        self.apply(_EVENTS[signal.Signals(sig)])

    def _on_idle(self) -> None:
        # Only closing reacts to the count reaching zero; skip the decision on the hot path otherwise.
        if self.state.status.phase == drain.Phase.CLOSING:
            self.apply(drain.Event.IDLE)

    def apply(self, event: drain.Event) -> None:
        state = self.state
        before = state.status
        decision = drain.next_stage(
            before,
            event,
            inflight=len(state.inflight),
            drain_secs=self.config.drain.shutdown_drain_secs,
            now=self._clock(),
        )
        state.status = decision.status
        if decision.status.phase != drain.Phase.STARTING:
            self.left_starting.set()
        if decision.status.t0 is not None and before.t0 is None:
            self._completed_at_t0 = state.inflight.completed
            self._started_at_t0 = state.inflight.started
            if state.tracer is not None:
                tracing.event_each(state.inflight.requests(), spans.DRAIN_STARTED)
        inflight_before_actions = len(state.inflight)
        for action in decision.actions:
            self._do(action)
        if decision.status.phase != before.phase:
            self.metrics.set_state(decision.status.phase.value, drain.PHASES)
            self.process.phase_changed(decision.status.phase)
        for log_event in decision.events:
            self._log_event(log_event, event, decision, inflight_before_actions)

    def _do(self, action: drain.Action) -> None:
        loop = self.loop
        assert loop is not None
        drain_cfg = self.config.drain
        if action == drain.Action.START_WINDOW:
            self._timers.append(loop.call_later(drain_cfg.shutdown_drain_secs, self.apply, drain.Event.WINDOW_ELAPSED))
        elif action == drain.Action.START_DEADLINE:
            deadline = drain_cfg.deadline_secs()
            if deadline is not None:
                self._timers.append(loop.call_later(deadline, self.apply, drain.Event.DEADLINE))
                if self.state.status.t0 is not None:  # scraped before the abort: the deadline alert's lead
                    self.metrics.drain_deadline.set(self.state.status.t0 + deadline)
        elif action == drain.Action.CLOSE_LISTENERS:
            self.process.close_listeners()
        elif action == drain.Action.ABORT_INFLIGHT:
            self.aborted += self.state.inflight.abort_all()
        elif action == drain.Action.EXIT:
            for timer in self._timers:
                timer.cancel()
            self.state.drained_cleanly = self.state.status.exit_code == drain.EXIT_CLEAN and self.aborted == 0
            self.state.drain_finished.set()
            self.exited.set()
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
