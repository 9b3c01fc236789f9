"""What counts as a lost request: pure functions over what a streaming client saw.

No I/O here. A client records a :class:`StreamResult` (status, the ``data:`` payloads in order, the
error it hit, if any) and :func:`classify` says whether the answer arrived whole. Lost is: a
non-200 answer, a connection error, a stream without ``[DONE]``, or one with missing, repeated or
unreadable chunks (the fake model numbers every chunk with ``seq``, from 0, and ``total``).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json

DONE = "[DONE]"


class Outcome(str, enum.Enum):
    OK = "ok"
    """200, every chunk in order, then ``[DONE]``, and a clean end of the response."""
    CONNECT_ERROR = "connect_error"
    """No answer at all: refused, reset or timed out before a status line."""
    HTTP_ERROR = "http_error"
    """An answer other than 200 (a balancer's 502/503, a router's 502...)."""
    CUT = "cut"
    """200, then the connection failed mid-body."""
    NO_DONE = "no_done"
    """The body ended cleanly but without ``data: [DONE]``."""
    MISSING_CHUNKS = "missing_chunks"
    """``[DONE]`` came, but sequence numbers are missing."""
    BAD_CHUNK = "bad_chunk"
    """A chunk that is not JSON with a ``seq``, out of order, repeated, or data after ``[DONE]``."""
    LEFT = "left"
    """The client closed the stream on purpose before its end (a user who gives up): not a loss."""

    @property
    def lost(self) -> bool:
        return self not in (Outcome.OK, Outcome.LEFT)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamResult:
    status: int | None
    """The HTTP status, ``None`` when no answer arrived."""
    events: tuple[str, ...] = ()
    """The ``data:`` payloads, in arrival order, ``[DONE]`` included."""
    error: str | None = None
    """The transport error the client hit, if any (before or after the status)."""
    expected_chunks: int | None = None
    """How many chunks the client asked for; ``None`` trusts the chunks' own ``total``."""
    left: bool = False
    """The client closed the stream on purpose after a 200 and some chunks."""


def classify(result: StreamResult) -> Outcome:
    """The outcome of one streamed completion. Purely computational."""
    if result.status is None:
        return Outcome.CONNECT_ERROR
    if result.status != 200:
        return Outcome.HTTP_ERROR
    if result.left:
        return Outcome.LEFT
    if result.error is not None:
        return Outcome.CUT
    if DONE not in result.events:
        return Outcome.NO_DONE
    done_at = result.events.index(DONE)
    if done_at != len(result.events) - 1:
        return Outcome.BAD_CHUNK
    seqs: list[int] = []
    totals: set[int] = set()
    for payload in result.events[:done_at]:
        try:
            chunk = json.loads(payload)
        except ValueError:
            return Outcome.BAD_CHUNK
        seq = chunk.get("seq") if isinstance(chunk, dict) else None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            return Outcome.BAD_CHUNK
        seqs.append(seq)
        if isinstance(chunk.get("total"), int):
            totals.add(chunk["total"])
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        return Outcome.BAD_CHUNK
    if len(totals) > 1:
        return Outcome.BAD_CHUNK
    expected = result.expected_chunks
    if expected is None:
        expected = totals.pop() if totals else len(seqs)
    if seqs and seqs[-1] >= expected:
        return Outcome.BAD_CHUNK
    if seqs != list(range(expected)):
        return Outcome.MISSING_CHUNKS
    return Outcome.OK


class SSEDecoder:
    """Incremental server-sent-events decoder: feed bytes as they arrive, get ``data`` payloads.

    Multi-line data fields are joined with ``\\n``; comments and other fields are ignored; ``\\r\\n``,
    ``\\r`` and ``\\n`` all end lines (the SSE standard). A trailing event without its blank line
    is not returned: an event is only complete once its terminating blank line arrives.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []
        self._pending_cr = False

    def feed(self, data: bytes) -> list[str]:
        text = data.decode("utf-8", errors="replace")
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = text.endswith("\r")
        self._buffer += text.replace("\r\n", "\n").replace("\r", "\n")
        events: list[str] = []
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events


def events_of(body: bytes) -> list[str]:
    """The ``data`` payloads of a whole SSE body: :class:`SSEDecoder` fed it at once."""
    return SSEDecoder().feed(body)
