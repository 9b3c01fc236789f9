"""RFC 9113 §5.1 as the gRPC listener's table holds it (drain_router.h2.streams), read against
the RFC's own sentences, and the memory of closed streams."""

from __future__ import annotations

import pytest

from drain_router.h2 import frames
from drain_router.h2.streams import IDLE, Closed, ClosedStreams, State, Verdict, received

D, H, PR, RS, WU = frames.DATA, frames.HEADERS, frames.PRIORITY, frames.RST_STREAM, frames.WINDOW_UPDATE
A, I, S, C, P = (
    Verdict.ACCEPT,
    Verdict.IGNORE,
    Verdict.STREAM_CLOSED,
    Verdict.CONNECTION_STREAM_CLOSED,
    Verdict.PROTOCOL_ERROR,
)

RFC = [
    # idle: "Receiving any frame other than HEADERS or PRIORITY on a stream in this state MUST be
    # treated as a connection error of type PROTOCOL_ERROR."
    (IDLE, H, A),
    (IDLE, PR, A),
    (IDLE, D, P),
    (IDLE, RS, P),
    (IDLE, WU, P),
    # open: "frames of any type"
    *[(State.OPEN, kind, A) for kind in (D, H, PR, RS, WU)],
    # half-closed (local): "An endpoint can receive any type of frame in this state."
    *[(State.HALF_CLOSED_LOCAL, kind, A) for kind in (D, H, PR, RS, WU)],
    # half-closed (remote): "If an endpoint receives additional frames, other than WINDOW_UPDATE,
    # PRIORITY, or RST_STREAM, for a stream that is in this state, it MUST respond with a stream
    # error of type STREAM_CLOSED."
    (State.HALF_CLOSED_REMOTE, D, S),
    (State.HALF_CLOSED_REMOTE, H, S),
    (State.HALF_CLOSED_REMOTE, PR, A),
    (State.HALF_CLOSED_REMOTE, RS, A),
    (State.HALF_CLOSED_REMOTE, WU, A),
    # closed after this end's RST_STREAM: "the endpoint MUST ignore frames that it receives on
    # closed streams after it has sent a RST_STREAM frame"
    *[(Closed.RESET_HERE, kind, I) for kind in (D, H, PR, RS, WU)],
    # closed after the peer's RST_STREAM: "any frame other than PRIORITY ... MUST treat that as a
    # stream error of type STREAM_CLOSED", but "after receiving a RST_STREAM on a stream, the
    # receiver MUST NOT send additional frames for that stream" (§6.4): so the connection's error
    # (a second RST_STREAM is never answered: no loops)
    (Closed.RESET_THERE, D, C),
    (Closed.RESET_THERE, H, C),
    (Closed.RESET_THERE, WU, C),
    (Closed.RESET_THERE, PR, I),
    (Closed.RESET_THERE, RS, I),
    # closed after both END_STREAMs: "any frames after receiving a frame with the END_STREAM flag
    # set MUST treat that as a connection error of type STREAM_CLOSED", except WINDOW_UPDATE and
    # RST_STREAM for a short period, and PRIORITY at any time
    (Closed.ENDED, D, C),
    (Closed.ENDED, H, C),
    (Closed.ENDED, WU, I),
    (Closed.ENDED, RS, I),
    (Closed.ENDED, PR, I),
    # forgotten: the mildest answer that is still an error
    (Closed.FORGOTTEN, D, S),
    (Closed.FORGOTTEN, H, S),
    (Closed.FORGOTTEN, WU, I),
    (Closed.FORGOTTEN, RS, I),
]


@pytest.mark.parametrize(("state", "kind", "verdict"), RFC)
def test_the_table_says_what_rfc_9113_says(state: object, kind: int, verdict: Verdict) -> None:
    assert received(state, kind) is verdict  # type: ignore[arg-type]


def test_closed_streams_are_forgotten_oldest_half_first_and_known_as_forgotten() -> None:
    closed = ClosedStreams(2)  # remembers at least 2, at most 4
    for sid, how in ((1, Closed.ENDED), (5, Closed.RESET_HERE), (3, Closed.RESET_THERE), (7, Closed.ENDED)):
        closed.add(sid, how)
    assert (closed.state(1), closed.state(5), closed.state(3)) == (Closed.ENDED, Closed.RESET_HERE, Closed.RESET_THERE)
    closed.add(9, Closed.RESET_HERE)  # past four: the three that closed first are forgotten
    assert closed.forgotten_up_to == 5
    assert [closed.state(sid) for sid in (1, 3, 5)] == [Closed.FORGOTTEN] * 3
    assert (closed.state(7), closed.state(9)) == (Closed.ENDED, Closed.RESET_HERE)
    assert closed.state(11) is None  # never seen
    assert len(closed.how) == 2
