"""When a drain sends open WebSocket sessions Close 1001 (Going Away): ``--websocket-close-at``. Pure.

- ``deadline``: at the in-flight deadline only; a session lives as long as the pod may.
- ``closing``: at the start of closing, every session at once (and every session opened after).
- ``idle``: from the start of closing, each session at the first moment it has been quiet both ways
  (no bytes read from the client or the model server) for :data:`WEBSOCKET_QUIET_SECS`; a session
  never that quiet gets it at the deadline, as with ``deadline``.

:func:`at_closing` says what closing does to a session; :func:`quiet_left` says how long an ``idle``
session still has to stay quiet (the tunnel stamps the time of each read and checks with one timer).
"""

from __future__ import annotations

import enum

DEADLINE = "deadline"
CLOSING = "closing"
IDLE = "idle"
MODES = (DEADLINE, CLOSING, IDLE)
"""The choices of ``--websocket-close-at``."""

#: ``idle``, from a measurement (``python -m bench.ws_close_at``, docs/drain.md): a rolling restart of
#: 3 routers with 12 realtime sessions talking in turns, grace 30 s, took 85 s under ``deadline``
#: (every router held to its deadline, exit 1, 9 of 19 sessions cut in the middle of a response),
#: 4 s under ``closing`` (5 of 19 cut mid-turn) and 23 s under ``idle`` (every router exit 0, all 19
#: sessions closed between turns).
DEFAULT = IDLE

#: How long an ``idle`` session must have read nothing from either side before it gets its 1001.
#: Long enough not to cut a session between a user's turn and the model's first frame: the model
#: server's first event answering a turn (its time to first token, queueing included) comes well
#: within it on a loaded engine, and frames within a response come tens of milliseconds apart. Short
#: enough to end a rollout quickly: each replica adds at most this much past its sessions' current
#: turns, against a grace of minutes; and well below keep-alive ping intervals (20 s and more), so a
#: ping does not keep a session looking busy.
WEBSOCKET_QUIET_SECS = 3.0


class AtClosing(enum.Enum):
    """What the start of closing does to an open session (and to one opened during closing)."""

    KEEP = "keep"
    """Nothing: the session lives until it ends or the deadline sends its 1001."""
    GO_AWAY = "go_away"
    """Close 1001 both ways now."""
    WATCH = "watch"
    """Close 1001 both ways once the session has been quiet for :data:`WEBSOCKET_QUIET_SECS`."""


_AT_CLOSING = {DEADLINE: AtClosing.KEEP, CLOSING: AtClosing.GO_AWAY, IDLE: AtClosing.WATCH}


def at_closing(mode: str) -> AtClosing:
    """What closing does to sessions under ``--websocket-close-at mode`` (one of :data:`MODES`)."""
    return _AT_CLOSING[mode]


def quiet_left(now: float, last_read: float, quiet_secs: float = WEBSOCKET_QUIET_SECS) -> float:
    """Seconds until a session whose last read (either side) was at ``last_read`` will have been quiet
    for ``quiet_secs``, if nothing more is read; ``0.0`` when it already has: its 1001 is due."""
    return max(0.0, last_read + quiet_secs - now)
