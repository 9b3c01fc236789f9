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
LINES = (CHUNK, b": ping", b"id: 3", b"retry: 10", b"event: message")
BEFORE_DONE = (b"", b"id: 9{end}", b": c{end}", b"data: x{end}")
DONES = (b"data: [DONE]", b"data:[DONE]", b"data: [DONE] ", b"data:  [DONE]", b"data: [DONE]x", b"data: [DONE")
AFTER_DONE_LINE = (b"", b"retry: 1{end}", b"data: y{end}")
AFTER = (b": bye", b"id: 10", b"data: {}", b" ")


def stream(choose: Callable[[Sequence[Any]], Any], number: Callable[[int, int], int]) -> bytes:
    end = choose(LINE_ENDS)
    parts: list[bytes] = []
    for _ in range(number(0, 4)):
        parts.append(choose(LINES) + end)
        if choose((True, False)):
            parts.append(end)
    if choose((True, False)):
        before = choose(BEFORE_DONE).replace(b"{end}", end)
        after = choose(AFTER_DONE_LINE).replace(b"{end}", end)
        parts.append(before + choose(DONES) + end + after + choose((end, b"")))
        for _ in range(number(0, 3)):
            parts.append(choose(AFTER) + end + choose((end, b"")))
    body = b"".join(parts)
    if choose((True, False)):
        body = body[: number(0, len(body))]
    return body


def reads(body: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``body`` cut at ``cuts`` (those inside it), in order, none empty."""
    points = sorted({0, *(c for c in cuts if 0 < c < len(body)), len(body)})
    return [body[a:b] for a, b in itertools.pairwise(points) if b > a]


def sdk_saw_done(pieces: Sequence[bytes]) -> bool:
    """What the OpenAI SDK's stream does with these reads: whether it stopped at a ``[DONE]`` event."""
    return any(event.data.startswith("[DONE]") for event in SSEDecoder().iter_bytes(iter(pieces)))
