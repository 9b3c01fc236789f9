"""Honest stream ends: whether a server-sent-events response ended with its terminal event. Pure.

An engine that shuts down (llama-cpp-python's server, vLLM) ends its open streams with a clean end
of body and no terminal event, and the OpenAI SDK then raises nothing: the application just gets a
shorter answer. The router sees the whole stream, so it can tell: when an OpenAI-style stream ends
without its terminal event, the exchange appends :data:`TRUNCATED_EVENT`, which the SDK raises on
(a streamed event whose data is a JSON object with an ``error`` key).

The end is judged as the OpenAI SDK's decoder reads the stream (``openai._streaming.SSEDecoder``),
incrementally, read by read (:class:`StreamEnd`): lines end at CR, LF or CRLF (a CRLF split between
two reads is one line end), a blank line dispatches the event, ``:`` starts a comment, one space
after a field's colon is dropped, an event's data is its ``data:`` lines joined, and the SDK stops
at the first event whose data starts with ``[DONE]``: whatever follows it (a comment, an ``id:``
line, more events, however many reads of them) cannot make the stream truncated. A ``data: [DONE]``
line that no blank line dispatched was never seen by the SDK.

What is kept per stream is bounded whatever the stream: a few flags and the first
:data:`LINE_PREFIX` bytes of a line still arriving (all that tells its field and whether its value is
``[DONE]`` or a terminal name). A read that starts at an event boundary, ends with LF LF and holds no
``[DONE]`` (nearly every read of an engine's stream) leaves a chat or completions stream's state as it
was, which two scans of its bytes in C tell; any other read is decoded line by line.
"""

from __future__ import annotations

import json
import re

from drain_router.decisions.stream_ends import DONE_DATA, CutMark
from drain_router.http1.heads import CHUNKED, UNTIL_CLOSE

#: Stream kinds. ``NOT_SSE``: anything else (never touched); ``DONE``: chat and completions streams,
#: ended by ``data: [DONE]``; ``NAMED``: Responses API streams, ended by a terminal named event.
NOT_SSE, DONE, NAMED = range(3)

#: What is kept of a line still arriving: its first bytes, enough to tell its field, whether a data
#: line's value starts with ``[DONE]`` and whether an event name is terminal.
LINE_PREFIX = 64
#: The Responses API's terminal events: the response's lifecycle ends with exactly one of them.
TERMINAL_NAMES = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})


def _event(message: str, kind: str) -> bytes:
    data = json.dumps({"error": {"message": message, "type": kind}})
    return b"event: error\ndata: " + data.encode() + b"\n\n"


#: Appended when a stream ends without its terminal event (static text: nothing internal).
TRUNCATED_EVENT = _event(
    "The model server ended the stream without its terminal event: the response is incomplete.",
    CutMark.UPSTREAM_TRUNCATED,
)
#: Sent before the in-flight deadline cuts a stream that is at an event boundary.
DEADLINE_EVENT = _event(
    "The stream was cut at the router's drain deadline: the response is incomplete.", CutMark.DRAIN_DEADLINE
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


_LINE_END = re.compile(rb"[\r\n]")
_DONE_LINE = b"data: " + DONE_DATA
_DONE_LINE_TIGHT = b"data:" + DONE_DATA
_CR = 13
_COLON = 58


class StreamEnd:
    """The end of one event stream, decoded as the OpenAI SDK decodes it, one read at a time: the
    state between reads is a line still arriving (its first :data:`LINE_PREFIX` bytes), whether the
    last byte was a CR, the event being gathered (whether it has data and its first data line starts
    with ``[DONE]``; its name), whether an event that ends the stream was dispatched, and for a
    ``NAMED`` stream the name of the last named event dispatched.

    ``quick``: a ``DONE`` stream at an event boundary with nothing pending. The exchange skips
    :meth:`feed` for a read that keeps it so (:meth:`keeps`), the hot path: its bytes scanned in C,
    nothing stored."""

    __slots__ = ("cr", "done", "first", "kind", "last_name", "line", "name", "quick")

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.line = b""
        """The first :data:`LINE_PREFIX` bytes of a line still arriving (b"": at a line start)."""
        self.cr = False
        """The last byte was a CR: an LF right after it ends no line (a CRLF split between reads)."""
        self.first: bool | None = None
        """The event being gathered has data: whether its first data line starts with ``[DONE]``."""
        self.name: bytes | None = None
        """The event being gathered's name (its last ``event:`` line's value; None: none, or empty)."""
        self.done = False
        """An event whose data starts with ``[DONE]`` was dispatched: the SDK stopped there."""
        self.last_name: bytes | None = None
        """The name of the last named event dispatched."""
        self.quick = kind == DONE

    @staticmethod
    def keeps(piece: bytes) -> bool:
        """A read that leaves a ``DONE`` stream at an event boundary with nothing pending as it was:
        it holds no ``[DONE]``, and it ends with LF LF, whose last LF ends a blank line whatever
        comes before it (an LF right after a CR is skipped, but this one follows an LF), so every
        event in it is dispatched and no line or CR is left pending."""
        return piece.endswith(b"\n\n") and piece.find(DONE_DATA) < 0

    @staticmethod
    def ends_done(piece: bytes) -> bool:
        """A read from an event boundary with nothing pending that ends with a whole event whose
        first line is ``data: [DONE]`` (a model server's last read, often its whole answer): that
        event is dispatched and the SDK stops there, so the stream ended honestly, judged in C
        without a line of it taken one by one. (LF LF ends a blank line wherever it is, CRs or not:
        the first LF may be a CRLF's, skipped, but the second then ends an empty line; so the last
        event starts after the last LF LF before the final one.)"""
        if not piece.endswith(b"\n\n"):
            return False
        at = piece.rfind(b"\n\n", 0, len(piece) - 2)
        at = at + 2 if at >= 0 else 0
        return piece.startswith(_DONE_LINE, at) or piece.startswith(_DONE_LINE_TIGHT, at)

    def feed(self, piece: bytes) -> None:
        """One body piece, in order."""
        if self.kind == DONE:
            if self.quick:
                if self.keeps(piece):
                    return
                if self.ends_done(piece):
                    self.done = True
                    return
        elif self.line == b"" and not self.cr and self.first is None and self.name is None and self.keeps(piece):
            if _CR in piece:
                self._decode(piece)
                return
            # A NAMED stream's read at an event boundary: every event in it is dispatched, so the last
            # named one is the last ``event:`` line's (each "\nevent:" starts a line: no CR in it).
            at = piece.rfind(b"\nevent:") + 1
            if at or piece.startswith(b"event:"):
                value = piece[at + 6 : piece.index(b"\n", at)]
                value = value[1:] if value[:1] == b" " else value
                if value:
                    self.last_name = value
                    return
            else:
                return
        self._decode(piece)

    def _decode(self, piece: bytes) -> None:
        """Split ``piece`` into lines as the SDK's line decoder does, and take each whole one."""
        skip_lf = self.cr
        start = 0
        for match in _LINE_END.finditer(piece):
            end = match.start()
            if skip_lf and end == start and piece[end] != _CR:
                skip_lf = False
                start = end + 1
                continue
            line = piece[start : min(end, start + LINE_PREFIX)]
            if self.line:
                line = (self.line + line)[:LINE_PREFIX]
                self.line = b""
            self._take(line)
            skip_lf = piece[end] == _CR
            start = end + 1
        if start < len(piece):
            skip_lf = False
            if len(self.line) < LINE_PREFIX:
                self.line = (self.line + piece[start : start + LINE_PREFIX])[:LINE_PREFIX]
        self.cr = skip_lf
        self.quick = self.kind == DONE and not skip_lf and self.line == b"" and self.first is None and self.name is None

    def _take(self, line: bytes) -> None:
        """One whole line (its first :data:`LINE_PREFIX` bytes), as ``SSEDecoder.decode`` takes it."""
        if not line:
            # A blank line dispatches the event gathered (one with data or a name: an id or a retry
            # alone dispatches an event with neither, which changes nothing here).
            if self.first:
                self.done = True
            if self.name is not None:
                self.last_name = self.name
            self.first = self.name = None
        elif line[0] != _COLON:
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                if self.first is None:
                    self.first = value.startswith(DONE_DATA)
            elif field == b"event":
                self.name = value or None

    def at_boundary(self) -> bool:
        """The bytes relayed so far hold no partial line and no data of an event not yet dispatched
        (or there are none): an event appended now is read as one of its own."""
        return self.line == b"" and self.first is None

    def ended_honestly(self) -> bool:
        """Whether the stream so far ended with its terminal event, as the OpenAI SDK would read it:
        a dispatched event whose data starts with ``[DONE]`` (where the SDK stops reading), or, for a
        ``NAMED`` stream, a terminal name as the last named event dispatched."""
        return self.done or (self.kind == NAMED and self.last_name in TERMINAL_NAMES)


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
