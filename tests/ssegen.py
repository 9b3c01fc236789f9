"""Generated server-sent-event streams for the honest-end tests, and the oracle they are judged by:
the OpenAI SDK's own decoder (``openai._streaming.SSEDecoder``), never the router's code.

Streams are built from what engines and proxies write, with the odd lines the format allows: chunks,
comments, ids, retries, event names, a ``[DONE]`` event in its variants or none, sometimes more after
it, and sometimes the stream cut anywhere. ``choose(options)`` picks one of a list and
``number(lo, hi)`` an integer; a hypothesis ``draw`` or a seeded ``random.Random`` provides them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from openai._streaming import SSEDecoder

T = TypeVar("T")

LINE_ENDS = (b"\n", b"\r\n", b"\r")
CHUNK = b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "tok"}}]}'
LINES = (
    CHUNK,
    b": ping",
    b": data: [DONE]",
    b"id: 3",
    b"id",
    b"retry: 10",
    b"retry: x",
    b"event: message",
    b"event:",
    b"data",
    b"data:",
    b"x-unknown: [DONE]",
    b'data: {"text": "data: [DONE]"}',
)
BEFORE_DONE = (b"", b"id: 9{end}", b": c{end}", b"data: x{end}", b"event: done{end}", b"retry: 3{end}")
DONES = (
    b"data: [DONE]",
    b"data:[DONE]",
    b"data: [DONE] ",
    b"data:  [DONE]",
    b"data: [DONE]x",
    b"data: [DONE",
    b"data: [done]",
    b"data:[DONE]" + b" " * 80,
)
AFTER_DONE_LINE = (b"", b"retry: 1{end}", b"data: y{end}", b"id: 4{end}")
AFTER = (b": bye", b": keep-alive", b"id: 10", b"data: {}", b" ", CHUNK, b"data: [DO", b"event: message")


def stream(choose: Callable[[Sequence[Any]], Any], number: Callable[[int, int], int]) -> bytes:
    """A stream's bytes: lines whose ends are one of CR, LF and CRLF throughout, or each its own
    (a CR line end then an LF blank line is one CRLF line end, as a decoder reads it)."""
    mixed = choose((False, True))
    fixed = choose(LINE_ENDS)

    def end() -> bytes:
        return choose(LINE_ENDS) if mixed else fixed

    parts: list[bytes] = []
    for _ in range(number(0, 4)):
        parts.append(choose(LINES) + end())
        if choose((True, False)):
            parts.append(end())
    if choose((True, False)):
        before = choose(BEFORE_DONE).replace(b"{end}", end())
        after = choose(AFTER_DONE_LINE).replace(b"{end}", end())
        parts.append(before + choose(DONES) + end() + after + choose((end(), b"")))
        for _ in range(number(0, 3)):
            parts.append(choose(AFTER) + end() + choose((end(), b"")))
    body = b"".join(parts)
    if choose((True, False)):
        body = body[: number(0, len(body))]
    return body


def reads(body: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``body`` cut at ``cuts`` (those inside it), in order, none empty."""
    points = sorted({0, *(c for c in cuts if 0 < c < len(body)), len(body)})
    return [body[a:b] for a, b in itertools.pairwise(points) if b > a]


def sdk_saw_done(pieces: Sequence[bytes]) -> bool:
    """What the OpenAI SDK's stream does with these reads: whether it stopped at a ``[DONE]`` event
    (``Stream.__stream__`` breaks at the first event whose data starts with it)."""
    return any(event.data.startswith("[DONE]") for event in SSEDecoder().iter_bytes(iter(pieces)))


TERMINAL_NAMES = ("response.completed", "response.failed", "response.incomplete")


def sdk_saw_terminal(pieces: Sequence[bytes]) -> bool:
    """For a Responses API stream: whether the SDK stopped at a ``[DONE]`` event, or the last named
    event it read is a terminal one."""
    last = None
    for event in SSEDecoder().iter_bytes(iter(pieces)):
        if event.data.startswith("[DONE]"):
            return True
        if event.event is not None:
            last = event.event
    return last in TERMINAL_NAMES


NAMES = (
    b"event: response.created",
    b"event: response.output_text.delta",
    b"event: response.completed",
    b"event:response.failed",
    b"event: response.incomplete",
    b"event: response.completed ",
    b"event:  response.completed",
    b"event:",
)
NAMED_LINES = (b'data: {"type": "x"}', b": ping", b"id: 5", b"data: [DONE]", b"event: response.completed" + b"x" * 70)


def named_stream(choose: Callable[[Sequence[Any]], Any], number: Callable[[int, int], int]) -> bytes:
    """A Responses API stream's bytes: events named or not (terminal names among them, in their
    variants), odd lines between, line ends fixed or mixed, sometimes cut anywhere."""
    mixed = choose((False, True))
    fixed = choose(LINE_ENDS)

    def end() -> bytes:
        return choose(LINE_ENDS) if mixed else fixed

    parts: list[bytes] = []
    for _ in range(number(0, 5)):
        if choose((True, True, False)):
            parts.append(choose(NAMES) + end())
        for _ in range(number(0, 2)):
            parts.append(choose(NAMED_LINES) + end())
        if choose((True, True, False)):
            parts.append(end())
    body = b"".join(parts)
    if choose((True, False)):
        body = body[: number(0, len(body))]
    return body
