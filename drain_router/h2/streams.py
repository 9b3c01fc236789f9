"""A stream's life on one HTTP/2 connection (RFC 9113 §5.1): its states, the one table that says what
a received frame does in each, how a stream left, and the closed streams a connection remembers.
Pure: no I/O; table-tested.

Server push is off both ways (SETTINGS_ENABLE_PUSH 0, PUSH_PROMISE a connection error), so the
reserved states never occur. A closed stream is told apart by how it closed, as RFC 9113 §5.1 needs:
frames the peer sent before it saw this end's RST_STREAM are ignored; after the peer's own
RST_STREAM, or after both ends' END_STREAM, the same frames are errors.
"""

from __future__ import annotations

import collections
import enum
from typing import Any, Final, Protocol

from drain_router.h2 import frames

Headers = list[tuple[bytes, bytes]]


class State(enum.Enum):
    """RFC 9113 §5.1's states of a stream that is on the connection."""

    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"
    """This end sent END_STREAM; the peer is still sending."""
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    """The peer sent END_STREAM; this end is still sending."""
    CLOSED = "closed"
    """Off the connection (how it closed: :class:`Closed`, remembered by :class:`ClosedStreams`)."""


class Closed(enum.Enum):
    """How a stream that left the connection closed: what a late frame on it means (§5.1)."""

    ENDED = "ended"
    """Both ends sent END_STREAM."""
    RESET_HERE = "reset here"
    """This end sent RST_STREAM: frames the peer sent before it saw it are in flight."""
    RESET_THERE = "reset there"
    """The peer sent RST_STREAM."""
    FORGOTTEN = "forgotten"
    """Closed so long ago that it is no longer remembered (see :class:`ClosedStreams`)."""


class Exit(enum.Enum):
    """Why a stream left its connection: told to its handler exactly once (:meth:`Handler.on_closed`)."""

    ENDED = "ended"
    """Both ends sent END_STREAM."""
    PEER_RESET = "peer_reset"
    """The peer sent RST_STREAM (its code is passed with it)."""
    RESET = "reset"
    """This end reset it: its handler asked (the call ended, a deadline)."""
    MALFORMED = "malformed"
    """The peer's header block or content-length broke RFC 9113 §8: reset with PROTOCOL_ERROR."""
    VIOLATION = "violation"
    """The peer broke the stream's state or flow control (§5.1, §6.9): reset with the code the RFC names."""
    REFUSED = "refused"
    """The peer's GOAWAY left it unprocessed (a stream this end opened, above its last stream id)."""
    LOST = "lost"
    """The connection closed or failed under it."""


class Verdict(enum.Enum):
    """What a received frame does to a stream (the cells of :data:`RECEIVED`)."""

    ACCEPT = "accept"
    IGNORE = "ignore"
    """Allowed, or in flight across a reset: dropped (DATA still counts against the connection's
    window, a header block is still decoded, to keep HPACK in step)."""
    STREAM_CLOSED = "stream error STREAM_CLOSED"
    """RST_STREAM(STREAM_CLOSED) for this stream; the connection goes on."""
    CONNECTION_STREAM_CLOSED = "connection error STREAM_CLOSED"
    PROTOCOL_ERROR = "connection error PROTOCOL_ERROR"


# The hot paths compare against these: on Python 3.11 an Enum member read as a class attribute goes
# through a descriptor (about 80 ns, ten times a module global).
OPEN: Final = State.OPEN
HALF_CLOSED_LOCAL: Final = State.HALF_CLOSED_LOCAL
HALF_CLOSED_REMOTE: Final = State.HALF_CLOSED_REMOTE
CLOSED: Final = State.CLOSED
ACCEPT: Final = Verdict.ACCEPT

IDLE: Final = "idle"
"""A stream id the peer may still open (higher than any it opened): not a :class:`State` member since
an idle stream has no object."""

A, I, S, C, P = (
    Verdict.ACCEPT,
    Verdict.IGNORE,
    Verdict.STREAM_CLOSED,
    Verdict.CONNECTION_STREAM_CLOSED,
    Verdict.PROTOCOL_ERROR,
)
_D, _H, _PR, _RS, _WU = frames.DATA, frames.HEADERS, frames.PRIORITY, frames.RST_STREAM, frames.WINDOW_UPDATE

RECEIVED: Final[dict[Any, dict[int, Verdict]]] = {
    #                         DATA      HEADERS   PRIORITY  RST_STREAM  WINDOW_UPDATE
    IDLE:                    {_D: P,    _H: A,    _PR: A,   _RS: P,     _WU: P},
    State.OPEN:              {_D: A,    _H: A,    _PR: A,   _RS: A,     _WU: A},
    State.HALF_CLOSED_LOCAL: {_D: A,    _H: A,    _PR: A,   _RS: A,     _WU: A},
    State.HALF_CLOSED_REMOTE: {_D: S,   _H: S,    _PR: A,   _RS: A,     _WU: A},
    Closed.RESET_HERE:       {_D: I,    _H: I,    _PR: I,   _RS: I,     _WU: I},
    Closed.RESET_THERE:      {_D: C,    _H: C,    _PR: I,   _RS: I,     _WU: C},
    Closed.ENDED:            {_D: C,    _H: C,    _PR: I,   _RS: I,     _WU: I},
    Closed.FORGOTTEN:        {_D: S,    _H: S,    _PR: I,   _RS: I,     _WU: I},
}  # fmt: skip
"""RFC 9113 §5.1, frame by frame: what a frame received on a stream in each state does. A stream id
this end never saw opened and that is not idle (a skipped id below the highest one) is a connection
error PROTOCOL_ERROR (§5.1.1). Reading it: in half-closed (remote) the peer has ended its side, so
its DATA or HEADERS is STREAM_CLOSED (§5.1); after this end's RST_STREAM the peer's frames are in
flight and ignored; after the peer's RST_STREAM anything but PRIORITY is STREAM_CLOSED, a late
RST_STREAM excepted, and since nothing but PRIORITY may be sent on a stream after its RST_STREAM
(§6.4), it is a connection error; after both END_STREAMs a WINDOW_UPDATE or RST_STREAM may still cross and is
ignored, DATA or HEADERS is a connection error; a stream closed so long ago that it is forgotten
gets the mildest answer that is still an error (a stream error, never the whole connection)."""


VERDICTS: Final = {id(state): row for state, row in RECEIVED.items()}
""":data:`RECEIVED` by the identity of its states, for the per-frame path (an Enum member hashes in
Python, through ``__hash__``)."""


def received(state: State | Closed | str, kind: int) -> Verdict:
    """The verdict of :data:`RECEIVED` (frame types it does not list are connection-level or
    unknown and never reach it)."""
    return VERDICTS[id(state)][kind]


class ClosedStreams:
    """How the streams that left a connection closed, for at least the last ``capacity`` of them
    (at most twice as many: the oldest half is forgotten at once, so remembering costs one dict
    store per stream).

    A stream id at or below the highest one opened that is neither open nor remembered was either
    never opened (a connection error, §5.1.1) or forgotten. Streams are forgotten in the order they
    closed, so every stream that closed after the newest forgotten one is still remembered: an
    unknown id above :attr:`forgotten_up_to` was never opened; one at or below it may have been, and
    is answered as :attr:`Closed.FORGOTTEN`.
    """

    __slots__ = ("capacity", "forgotten_up_to", "how")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.how: dict[int, Closed] = {}
        self.forgotten_up_to = 0

    def add(self, sid: int, how: Closed) -> None:
        self.how[sid] = how
        if len(self.how) > 2 * self.capacity:
            self.forget_oldest()

    def forget_oldest(self) -> None:
        """Forget all but the ``capacity`` that closed last."""
        sids = list(self.how)
        self.forgotten_up_to = max(self.forgotten_up_to, max(sids[: -self.capacity]))
        how = self.how
        self.how = {sid: how[sid] for sid in sids[-self.capacity :]}

    def state(self, sid: int) -> Closed | None:
        """How ``sid`` closed; None: never opened (it is above the newest forgotten stream)."""
        how = self.how.get(sid)
        if how is None and sid <= self.forgotten_up_to:
            return Closed.FORGOTTEN
        return how


class Handler(Protocol):
    """What a stream tells whoever relays it (a call, or a health answer): its events, in order, and
    exactly one :meth:`on_closed` when it leaves the connection, whatever the cause."""

    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        """A header block after the first one (a response's head; trailers), checked already."""

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None: ...

    def on_sent(self, stream: Stream, n: int) -> None:
        """``n`` bytes that waited for the peer's window went out."""

    def on_end_sent(self, stream: Stream) -> None:
        """This end's END_STREAM (or trailers) went out while the peer is still sending (when both
        ends are done, :meth:`on_closed` says so instead)."""

    def on_writable(self, stream: Stream) -> None:
        """The connection's transport took its buffered output."""

    def on_closed(self, stream: Stream, exit: Exit, code: int) -> None:
        """The stream left the connection (``code``: the RST_STREAM's, or the connection's error)."""


class Stream:
    """One stream on one connection: its state, its windows both ways, and what waits for the peer's
    window."""

    __slots__ = (
        "asked_head",
        "body_left",
        "handler",
        "heads",
        "owed",
        "pending",
        "pending_end",
        "pending_trailers",
        "recv_window",
        "send_window",
        "sid",
        "state",
        "ungranted",
    )

    def __init__(self, sid: int, handler: Handler | None, send_window: int, recv_window: int) -> None:
        self.sid = sid
        self.handler: Handler = handler  # type: ignore[assignment]  # set before any event (see Connection)
        self.state = OPEN
        self.send_window = send_window
        self.recv_window = recv_window
        self.ungranted = 0
        """Bytes taken by the other side, not yet announced in a WINDOW_UPDATE (batched)."""
        self.owed = 0
        """Bytes relayed into a paused transport: granted once it resumes."""
        self.pending: collections.deque[bytes] = collections.deque()
        self.pending_end = False
        self.pending_trailers: Headers | None = None
        self.heads = 0
        """Header blocks received (the first is the request or response head)."""
        self.body_left = -1
        """What the peer's DATA may still carry by its ``content-length`` (-1: no check), §8.1.1."""
        self.asked_head = False
        """This end opened the stream with a HEAD request: the response has no content."""
