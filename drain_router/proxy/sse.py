"""Honest stream ends: whether a server-sent-events response ended with its terminal event. Pure.

An engine that shuts down (llama-cpp-python's server, vLLM) ends its open streams with a clean end
of body and no terminal event, and the OpenAI SDK then raises nothing: the application just gets a
shorter answer. The router sees the whole stream, so it can tell: when an OpenAI-style stream ends
without its terminal event, the exchange appends :data:`TRUNCATED_EVENT`, which the SDK raises on
(a streamed event whose data is a JSON object with an ``error`` key).

What is kept per stream is O(1) and bounded: its kind (:func:`kind`, decided once from the request
target and the response head), and its tail, the last bytes relayed (:func:`keep`): a small piece
by reference, else a copy of its last :data:`TAIL` bytes, so never more than :data:`TAIL_MAX`
bytes. No event is parsed as it passes; the tail is read once, when the body ends
(:func:`ended_honestly`), since a terminal event is the last event of a stream. A Responses API
stream names its events, and its terminal one carries the whole response (far longer than a tail),
so for that kind only each read is searched for the last ``event:`` line (:func:`last_event_name`).
"""

from __future__ import annotations

import json

from drain_router.proxy.rewrite import CHUNKED, UNTIL_CLOSE

#: Stream kinds. ``NOT_SSE``: anything else (never touched); ``DONE``: chat and completions streams,
#: ended by ``data: [DONE]``; ``NAMED``: Responses API streams, ended by a terminal named event.
NOT_SSE, DONE, NAMED = range(3)

#: Bytes of the stream's end that decide (``data: [DONE]`` with its line ends, an ``event:`` line).
TAIL = 64
#: A read's last body piece up to this size is kept whole, by reference (no copy on the hot path);
#: a longer one is cut to its last :data:`TAIL` bytes.
TAIL_MAX = 512
#: What the tail is before any body byte: a stream that has relayed nothing is at an event boundary.
START = b"\n\n"

#: The Responses API's terminal events: the response's lifecycle ends with exactly one of them.
TERMINAL_NAMES = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})

_DONE_LINES = (b"data: [DONE]", b"data:[DONE]")
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


def keep(tail: bytes, pieces: list[bytes]) -> bytes:
    """The tail after a read whose body pieces are ``pieces`` (in order; at least one). The
    exchange keeps a lone piece of :data:`TAIL` to :data:`TAIL_MAX` bytes itself (the hot path);
    this is for the rest: short pieces join what came before, long ones are cut."""
    last = pieces[-1]
    if TAIL <= len(last) <= TAIL_MAX:
        return last
    if len(last) > TAIL_MAX:
        return last[-TAIL:]
    joined = [tail]
    size = 0
    for piece in reversed(pieces):
        joined.insert(1, piece[-TAIL:])
        size += len(piece)
        if size >= TAIL:
            del joined[0]
            break
    return b"".join(joined)[-TAIL:]


def advance(stream: int, tail: bytes, name: bytes | None, pieces: list[bytes]) -> tuple[bytes, bytes | None]:
    """The tail and last event name after a read whose body pieces are ``pieces``, off the hot path
    (a lone piece of :data:`TAIL` to :data:`TAIL_MAX` bytes is the tail, kept by the exchange
    itself): a ``NAMED`` stream's reads are searched for their last ``event:`` line, from the
    previous tail on (a line split across reads is found whole in the next one)."""
    if stream != NAMED:
        return keep(tail, pieces), name
    window = b"".join([tail, *pieces])
    found = last_event_name(window)
    return window[-TAIL:], name if found is None else found


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


def at_boundary(tail: bytes) -> bool:
    """The bytes relayed so far end with a blank line: the client has no partial event."""
    return tail.endswith(_BOUNDARIES)


def ended_honestly(stream: int, tail: bytes, name: bytes | None) -> bool:
    """Whether a stream of kind ``stream`` whose body ended with ``tail`` (and whose last ``event:``
    line named ``name``, for a ``NAMED`` one) ended with its terminal event: ``data: [DONE]`` as its
    last line, or (Responses API) a whole event whose name is terminal."""
    if stream == NOT_SSE:
        return True
    last_line = tail.rstrip(b"\r\n").rsplit(b"\n", 1)[-1].rsplit(b"\r", 1)[-1]
    if last_line in _DONE_LINES:
        return True
    return stream == NAMED and name in TERMINAL_NAMES and at_boundary(tail)


def framed(event: bytes, mode: int) -> bytes:
    """An event as the client's body carries it: a chunk of its own, or as is (close-delimited)."""
    return b"%x\r\n%s\r\n" % (len(event), event) if mode == CHUNKED else event


LAST_CHUNK = b"0\r\n\r\n"


def truncated_end(mode: int, tail: bytes) -> tuple[bytes, bool]:
    """What the client gets when a stream framed to it as ``mode`` (see
    :func:`~drain_router.proxy.rewrite.client_head`) ended without its terminal event, after the
    bytes ending in ``tail``: ``(bytes to write, whether its connection is then cut)``.

    At an event boundary, :data:`TRUNCATED_EVENT` and the end of the body (the last chunk; a
    close-delimited body ends with the connection). Mid-event a chunked body is cut instead (no
    last chunk), since appending would complete the partial event; a close-delimited one just ends
    (an SSE client drops an event the body ends inside). A body of known length cannot be extended:
    nothing is added (the outcome and the log still say it)."""
    boundary = at_boundary(tail)
    if mode == CHUNKED:
        return (framed(TRUNCATED_EVENT, mode) + LAST_CHUNK, False) if boundary else (b"", True)
    if mode == UNTIL_CLOSE and boundary:
        return TRUNCATED_EVENT, False
    return b"", False


def deadline_end(mode: int, tail: bytes) -> bytes:
    """What a stream framed as ``mode`` gets just before the in-flight deadline cuts it:
    :data:`DEADLINE_EVENT` at an event boundary of a body that can be extended, else nothing (it is
    cut as it is)."""
    if mode in (CHUNKED, UNTIL_CLOSE) and at_boundary(tail):
        return framed(DEADLINE_EVENT, mode)
    return b""
