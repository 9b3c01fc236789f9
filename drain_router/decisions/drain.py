"""The drain state machine: ``starting -> serving -> draining -> closing -> exited``, forward only.

:func:`next_stage` is a purely computational function with no side effects: it takes the current
:class:`DrainStatus`, one :class:`Event`, what the caller observed (the in-flight count) and ``now``,
and returns a :class:`Decision` with the new status, the :class:`Action` s to carry out in order, and
the :class:`LogEvent` s to emit (each knows its level and the state it announces). The caller
(``drain_router.runtime.draining``) does the I/O.
"""

from __future__ import annotations

import dataclasses
import enum


class Phase(str, enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    CLOSING = "closing"
    EXITED = "exited"

    def __bool__(self) -> bool:
        # A phase is not a flag: "if status.phase:" is always a bug. Compare it.
        raise NotImplementedError("Phase has no truth value; compare it with a Phase member")

    @property
    def order(self) -> int:
        return _ORDER[self]


_ORDER = {phase: index for index, phase in enumerate(Phase)}
PHASES = tuple(phase.value for phase in Phase)


class Event(str, enum.Enum):
    UPSTREAM_HEALTHY = "upstream_healthy"
    """The model server answered its health path (or no health path is configured)."""
    SIGTERM = "sigterm"
    SIGINT = "sigint"
    WINDOW_ELAPSED = "window_elapsed"
    """``shutdown_drain_secs`` passed since t0."""
    IDLE = "idle"
    """The in-flight count reached zero."""
    DEADLINE = "deadline"
    """t0 + grace - margin passed (only scheduled when a grace is declared)."""


class Action(str, enum.Enum):
    START_WINDOW = "start_window"
    """Schedule WINDOW_ELAPSED at t0 + shutdown_drain_secs."""
    START_DEADLINE = "start_deadline"
    """Schedule DEADLINE at t0 + grace - margin, when a grace is declared."""
    CLOSE_LISTENERS = "close_listeners"
    """Stop accepting on the main listener and close idle keep-alive connections."""
    ABORT_INFLIGHT = "abort_inflight"
    """Cancel every in-flight request, counting them."""
    EXIT = "exit"
    """Finish: close the upstream session and the admin listener, exit with ``status.exit_code``."""


class LogEvent(str, enum.Enum):
    """The structured log events of the drain, one per state change, with their level."""

    STATE_SERVING = "state.serving"
    DRAIN_START = "drain.start"
    DRAIN_CLOSING = "drain.closing"
    DRAIN_COMPLETE = "drain.complete"
    DRAIN_DEADLINE = "drain.deadline"
    """The deadline struck: what was left is aborted and counted."""
    DRAIN_ABORTED = "drain.aborted"
    """A second SIGINT aborted everything."""
    SIGNAL_IGNORED = "drain.signal_ignored"
    """A SIGTERM while closing ("already closing; SIGKILL forces"), or a first SIGINT while closing."""

    @property
    def level(self) -> str:
        return "warning" if self in _WARNINGS else "info"

    @property
    def phase(self) -> Phase | None:
        """The state this event announces (one decision can pass through closing to exited);
        ``None`` for an event that announces no state."""
        return _EVENT_PHASE.get(self)


_WARNINGS = frozenset({LogEvent.DRAIN_DEADLINE, LogEvent.DRAIN_ABORTED, LogEvent.SIGNAL_IGNORED})
_EVENT_PHASE = {
    LogEvent.STATE_SERVING: Phase.SERVING,
    LogEvent.DRAIN_START: Phase.DRAINING,
    LogEvent.DRAIN_CLOSING: Phase.CLOSING,
    LogEvent.DRAIN_COMPLETE: Phase.EXITED,
    LogEvent.DRAIN_DEADLINE: Phase.EXITED,
    LogEvent.DRAIN_ABORTED: Phase.EXITED,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DrainStatus:
    phase: Phase = Phase.STARTING
    t0: float | None = None
    """When the first terminating signal arrived (caller's clock)."""
    sigints: int = 0
    exit_code: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    status: DrainStatus
    actions: tuple[Action, ...] = ()
    events: tuple[LogEvent, ...] = ()
    """Log events, one per state change (plus ``drain.signal_ignored``)."""
    reason: str | None = None
    """Why closing began (``window_elapsed``, ``second_sigterm``, ...), for the log fields."""


EXIT_CLEAN = 0
EXIT_ABORTED = 1


def _to_closing(status: DrainStatus, *, now: float, inflight: int, reason: str) -> Decision:
    """Enter closing; if nothing is in flight, exit right away (the idle router does not linger)."""
    first_signal = status.t0 is None
    actions: list[Action] = [Action.START_DEADLINE] if first_signal else []
    actions.append(Action.CLOSE_LISTENERS)
    closing = dataclasses.replace(status, phase=Phase.CLOSING, t0=now if first_signal else status.t0)
    events = [LogEvent.DRAIN_CLOSING]
    if inflight == 0:
        actions.append(Action.EXIT)
        events.append(LogEvent.DRAIN_COMPLETE)
        closing = dataclasses.replace(closing, phase=Phase.EXITED, exit_code=EXIT_CLEAN)
    return Decision(closing, tuple(actions), tuple(events), reason)


def next_stage(status: DrainStatus, event: Event, *, inflight: int, drain_secs: float, now: float) -> Decision:
    """Where the drain goes next. Purely computational; the caller performs ``actions`` in order."""
    phase = status.phase
    if phase == Phase.EXITED:
        return Decision(status)

    if event == Event.UPSTREAM_HEALTHY:
        if phase == Phase.STARTING:
            return Decision(dataclasses.replace(status, phase=Phase.SERVING), (), (LogEvent.STATE_SERVING,))
        return Decision(status)

    if event == Event.SIGTERM:
        if phase == Phase.STARTING:
            # Never reported ready, so no endpoint or balancer routes here: no window to wait out.
            return _to_closing(status, now=now, inflight=inflight, reason="sigterm_while_starting")
        if phase == Phase.SERVING:
            if drain_secs <= 0:
                return _to_closing(status, now=now, inflight=inflight, reason="no_drain_window")
            draining = dataclasses.replace(status, phase=Phase.DRAINING, t0=now)
            return Decision(draining, (Action.START_WINDOW, Action.START_DEADLINE), (LogEvent.DRAIN_START,))
        if phase == Phase.DRAINING:
            return _to_closing(status, now=now, inflight=inflight, reason="second_sigterm")
        return Decision(status, (), (LogEvent.SIGNAL_IGNORED,))

    if event == Event.SIGINT:
        counted = dataclasses.replace(status, sigints=status.sigints + 1)
        if status.sigints >= 1:
            aborted = dataclasses.replace(
                counted, phase=Phase.EXITED, exit_code=EXIT_ABORTED, t0=status.t0 if status.t0 is not None else now
            )
            return Decision(aborted, (Action.ABORT_INFLIGHT, Action.EXIT), (LogEvent.DRAIN_ABORTED,))
        if phase == Phase.CLOSING:
            return Decision(counted, (), (LogEvent.SIGNAL_IGNORED,))
        return _to_closing(counted, now=now, inflight=inflight, reason="sigint")

    if event == Event.WINDOW_ELAPSED:
        if phase == Phase.DRAINING:
            return _to_closing(status, now=now, inflight=inflight, reason="window_elapsed")
        return Decision(status)

    if event == Event.IDLE:
        if phase == Phase.CLOSING and inflight == 0:
            done = dataclasses.replace(status, phase=Phase.EXITED, exit_code=EXIT_CLEAN)
            return Decision(done, (Action.EXIT,), (LogEvent.DRAIN_COMPLETE,))
        return Decision(status)

    if event == Event.DEADLINE:
        if phase in (Phase.DRAINING, Phase.CLOSING):
            code = EXIT_ABORTED if inflight > 0 else EXIT_CLEAN
            done = dataclasses.replace(status, phase=Phase.EXITED, exit_code=code)
            return Decision(done, (Action.ABORT_INFLIGHT, Action.EXIT), (LogEvent.DRAIN_DEADLINE,))
        return Decision(status)

    raise ValueError(f"unknown drain event {event!r}")


def readiness(phase: Phase, upstream_up: bool | None) -> tuple[int, str]:
    """``/readyz`` answer: (HTTP status, status word). ``upstream_up`` is None when not checked."""
    if phase == Phase.SERVING:
        if upstream_up is False:
            return 503, "upstream_unavailable"
        return 200, "ready"
    if phase == Phase.STARTING:
        return 503, "starting"
    if phase == Phase.DRAINING:
        return 503, "draining"
    return 503, "closing"


def closes_connections(phase: Phase) -> bool:
    """Every response carries ``Connection: close`` from draining on, so pooled clients reconnect elsewhere."""
    return phase.order >= Phase.DRAINING.order
