"""``--websocket-close-at``'s decisions, as tables: what closing does to a session, and how long an
``idle`` session still has to stay quiet before its 1001."""

from __future__ import annotations

import pytest

from drain_router.config import shutdown
from drain_router.decisions import websocket_close as wc
from drain_router.decisions.websocket_close import AtClosing


@pytest.mark.parametrize(
    ("mode", "action"),
    [("deadline", AtClosing.KEEP), ("closing", AtClosing.GO_AWAY), ("idle", AtClosing.WATCH)],
)
def test_what_closing_does_in_each_mode(mode, action):
    assert wc.at_closing(mode) is action


def test_every_mode_is_a_choice_of_the_setting():
    assert set(wc.MODES) == {"deadline", "closing", "idle"}
    assert shutdown.WEBSOCKET_CLOSE_AT == wc.MODES
    assert wc.DEFAULT in wc.MODES


@pytest.mark.parametrize(
    ("now", "last_read", "quiet", "left"),
    [
        (100.0, 100.0, 3.0, 3.0),  # just read: the whole quiet period to go
        (101.0, 100.0, 3.0, 2.0),  # quiet for 1 s of 3
        (103.0, 100.0, 3.0, 0.0),  # exactly quiet long enough: due now
        (150.0, 100.0, 3.0, 0.0),  # quiet since long before closing: due at once
        (100.0, 100.5, 3.0, 3.5),  # a read stamped after ``now`` (clock granularity) never makes it due early
    ],
)
def test_quiet_left(now, last_read, quiet, left):
    assert wc.quiet_left(now, last_read, quiet) == pytest.approx(left)


def test_the_quiet_period_is_short_against_a_grace_but_not_a_token_gap():
    """Seconds, not tens of seconds (a rollout waits for it per replica), and not a fraction of a
    second (a model's first frame of an answer may take that long)."""
    assert 1.0 <= wc.WEBSOCKET_QUIET_SECS <= 10.0
    assert wc.quiet_left(0.0, 0.0) == wc.WEBSOCKET_QUIET_SECS
