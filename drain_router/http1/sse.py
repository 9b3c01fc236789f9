"""Honest stream ends: whether a server-sent-events response ended with its terminal event. Pure.

An engine that shuts down (llama-cpp-python's server, vLLM) ends its open streams with a clean end
of body and no terminal event, and the OpenAI SDK then raises nothing: the application just gets a
shorter answer. The router sees the whole stream, so it can tell: when an OpenAI-style stream ends
without its terminal event, the exchange appends :data:`TRUNCATED_EVENT`, which the SDK raises on
(a streamed event whose data is a JSON object with an ``error`` key).

The end is judged as the OpenAI SDK's decoder reads the stream (``openai._streaming.SSEDecoder``):
lines end at CR, LF or CRLF, a blank line dispatches the event, ``:`` starts a comment, one space
after a field's colon is dropped, and the SDK stops at the first event whose data starts with
``[DONE]``: whatever follows it (a comment, an ``id:`` line, more events) cannot make the stream
truncated. A ``data: [DONE]`` line that no blank line dispatched was never seen by the SDK.

What is kept per stream is bounded and costs no copy per read (:class:`StreamEnd`): references to
the last two body pieces (short ones joined), and for a Responses API stream the name of its last
``event:`` line. The window is decoded once, when the body ends (or the model server is lost):
exact whenever the terminal event and what follows it came in the stream's last two pieces; a
terminal event followed by two more reads, which no engine sends, is judged on the window alone.
A Responses API stream names its events, and its terminal one carries the whole response (far
longer than a window), so for that kind each read is also searched for its last ``event:`` line.
"""

from __future__ import annotations

import json
import re

from drain_router.http1.heads import CHUNKED, UNTIL_CLOSE

#: Stream kinds. ``NOT_SSE``: anything else (never touched); ``DONE``: chat and completions streams,
#: ended by ``data: [DONE]``; ``NAMED``: Responses API streams, ended by a terminal named event.
NOT_SSE, DONE, NAMED = range(3)

#: A body piece shorter than this is joined to the one before it (a bounded copy): the window, the last
#: two pieces, then always holds the terminal event with the boundary before it.
SHORT = 64
#: At most this much of the piece before a short one is kept when they are joined.
WINDOW = 1024
#: A piece longer than this is kept as a copy of its last :data:`WINDOW` bytes, not by reference: what
#: a stream holds stays under ``2 * LARGEST`` bytes whatever the model server's reads.
LARGEST = 4 * WINDOW
#: What a stream is preceded by: its first line starts a line, and its first event an event.
START = b"\n\n"
#: The bytes an ``event:`` line search joins across two reads (a line split between them).
TAIL = 64

#: The Responses API's terminal events: the response's lifecycle ends with exactly one of them.
TERMINAL_NAMES = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})

#: How nearly every chat or completions stream ends: a terminal event whose dispatch needs no decoding.
DONE_EVENT = b"\n\ndata: [DONE]\n\n"
#: The ends of a blank line (an event's end) in any of SSE's line endings (CRLF, LF, CR).
_BOUNDARIES = (b"\n\n", b"\r\r", b"\n\r\n", b"\r\r\n", b"\n\r")


def _event(message: str, kind: str) -> bytes:
    data = json.dumps({"error": {"message": message, "type": kind}})
    return b"event: error\ndata: " + data.encode() + b"\n\n"


#: Appended when a stream ends without its terminal event (static text: nothing internal).
TRUNCATED_EVENT = _event(
    "The model server ended the stream without its terminal event: the response is incomplete.",
    "upstream_truncated",
)
#: Sent before the in-flight deadline cuts a stream that is at an event boundary.
DEADLINE_EVENT = _event(
    "The stream was cut at the router's drain deadline: the response is incomplete.", "drain_deadline"
)


#: The OpenAI-style paths whose streams have a terminal event the router knows.
PATHS = (b"/completions", b"/responses")


def on_paths(target: bytes) -> bool:
    """The target's path (query string aside) is one of :data:`PATHS`'s."""
    return target.partition(b"?")[0].endswith(PATHS)


def kind(target: bytes, status: int, headers: list[tuple[bytes, bytes]]) -> int:
    """The stream kind of a response, decided once from its request target and its head: only a 2xx
    ``text/event-stream`` answer to an OpenAI-style path (``.../completions``: chat and
    completions; ``.../responses``: the Responses API) has a terminal event the router knows;
    anything else is ``NOT_SSE``."""
    if not 200 <= status < 300 or not on_paths(target):
        return NOT_SSE
    for name, value in headers:
        if name.lower() == b"content-type":
            if value.partition(b";")[0].strip().lower() != b"text/event-stream":
                return NOT_SSE
            return DONE if target.partition(b"?")[0].endswith(b"/completions") else NAMED
    return NOT_SSE


class StreamEnd:
    """The end of one event stream: its last two body pieces, by reference (a piece shorter than
    :data:`SHORT` is joined to the one before it, a longer one than :data:`LARGEST` cut to its last
    :data:`WINDOW` bytes: the only copies, both bounded), and for a ``NAMED`` stream its last event
    name.

    The exchange keeps a piece of :data:`SHORT` to :data:`LARGEST` bytes of a ``DONE`` stream
    itself (``fast``: three stores, the hot path); :meth:`feed` takes everything else."""

    __slots__ = ("fast", "kind", "last", "name", "prev", "seen")

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.fast = kind == DONE
        """The exchange may keep a read's lone piece itself (a ``NAMED`` stream's reads are searched)."""
        self.prev = b""
        self.last = b""
        self.seen = 0
        """Body bytes relayed in all: the window is the whole stream while it holds them all."""
        self.name: bytes | None = None
        """A ``NAMED`` stream's last complete ``event:`` line's value."""

    def feed(self, out: list[bytes], at: int) -> None:
        """One read's body pieces, ``out[at:]`` in order (at least one)."""
        pieces = out[at:]
        if self.kind == NAMED:
            found = last_event_name(b"".join([self.tail(TAIL), *pieces]))
            if found is not None:
                self.name = found
        if len(pieces) > 2:
            # A read of several pieces, off the hot path: its last WINDOW bytes (or all of it) as one.
            k, size = len(pieces), 0
            while k and size < WINDOW:
                k -= 1
                size += len(pieces[k])
            if k:
                self.seen += sum(map(len, pieces[:k]))
                self.prev = self.last = b""
            pieces = [b"".join(pieces[k:])]
        for piece in pieces:
            size = len(piece)
            self.seen += size
            if size < SHORT:
                self.last = self.last[-WINDOW:] + piece
            else:
                self.prev, self.last = self.last, piece if size <= LARGEST else piece[-WINDOW:]

    def tail(self, n: int) -> bytes:
        """The stream's last ``n`` bytes; while it is shorter, preceded by :data:`START`."""
        if len(self.last) >= n:
            return self.last[-n:]
        return (START + self.prev + self.last)[-n:]

    def at_boundary(self) -> bool:
        """The bytes relayed so far end with a blank line (or there are none): the client has no
        partial event."""
        return self.tail(3).endswith(_BOUNDARIES)

    def ended_honestly(self) -> bool:
        """Whether the stream so far ended with its terminal event, as the OpenAI SDK would read it:
        a dispatched event whose data starts with ``[DONE]`` (where the SDK stops reading), or, for a
        ``NAMED`` stream, a whole event whose name is terminal as the stream's last."""
        if self.kind == NAMED:
            if self.name in TERMINAL_NAMES and self.at_boundary():
                return True
        elif self.last.endswith(DONE_EVENT):
            # An empty line, then ``data: [DONE]`` as its event's first line, then the empty line
            # that dispatches it: what the SDK stops at, whatever came before (no decoding needed).
            return True
        window = self.prev + self.last
        return done_dispatched(window, whole=len(window) == self.seen)


_LINE_END = re.compile(rb"\r\n|\r|\n")


def done_dispatched(window: bytes, *, whole: bool) -> bool:
    """Whether decoding ``window`` as the OpenAI SDK does dispatches an event whose data starts with
    ``[DONE]``. ``whole``: the window is the stream from its start; else it starts anywhere, and
    decoding starts after its first blank line (the first event boundary it holds)."""
    lines = _LINE_END.split(window)
    lines.pop()  # an unterminated last line: no line yet (a blank one would dispatch nothing either)
    at = 0
    if not whole:
        # The first element may be the rest of a line; the first empty one after it is a boundary.
        at = next((i + 1 for i in range(1, len(lines)) if not lines[i]), len(lines))
    first_data: bytes | None = None
    for line in lines[at:]:
        if not line:
            if first_data is not None and first_data.startswith(b"[DONE]"):
                return True
            first_data = None
        elif line[0] != 58 and first_data is None:  # 58: ":" starts a comment
            field, _, value = line.partition(b":")
            if field == b"data":
                first_data = value[1:] if value.startswith(b" ") else value
    return False


def last_event_name(window: bytes) -> bytes | None:
    """The value of the last complete ``event:`` line in ``window`` (which starts at a line start),
    or None when it has none; b"" when its last ``event:`` line is not complete yet."""
    at = max(window.rfind(b"\nevent:"), window.rfind(b"\revent:"))
    if at < 0:
        return None
    line = window[at + 7 :]
    ends = [i for i in (line.find(b"\n"), line.find(b"\r")) if i >= 0]
    if not ends:
        return b""
    return line[: min(ends)].strip()


def framed(event: bytes, mode: int) -> bytes:
    """An event as the client's body carries it: a chunk of its own, or as is (close-delimited)."""
    return b"%x\r\n%s\r\n" % (len(event), event) if mode == CHUNKED else event


LAST_CHUNK = b"0\r\n\r\n"


def truncated_end(mode: int, boundary: bool) -> tuple[bytes, bool]:
    """What the client gets when a stream framed to it as ``mode`` (see
    :func:`~drain_router.http1.heads.client_head`) ended without its terminal event, its bytes so
    far ending at an event ``boundary`` or not: ``(bytes to write, whether its connection is then
    cut)``.

    At an event boundary, :data:`TRUNCATED_EVENT` and the end of the body (the last chunk; a
    close-delimited body ends with the connection). Mid-event a chunked body is cut instead (no
    last chunk), since appending would complete the partial event; a close-delimited one just ends
    (an SSE client drops an event the body ends inside). A body of known length cannot be extended:
    nothing is added (the outcome and the log still say it)."""
    if mode == CHUNKED:
        return (framed(TRUNCATED_EVENT, mode) + LAST_CHUNK, False) if boundary else (b"", True)
    if mode == UNTIL_CLOSE and boundary:
        return TRUNCATED_EVENT, False
    return b"", False


def deadline_end(mode: int, boundary: bool) -> bytes:
    """What a stream framed as ``mode`` gets just before the in-flight deadline cuts it:
    :data:`DEADLINE_EVENT` at an event ``boundary`` of a body that can be extended, else nothing
    (it is cut as it is)."""
    if mode in (CHUNKED, UNTIL_CLOSE) and boundary:
        return framed(DEADLINE_EVENT, mode)
    return b""
