"""The pure rules of honest stream ends (:mod:`drain_router.proxy.sse`), table by table: which
responses are streams with a known terminal event, how the tail is kept, what counts as ended."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drain_router.proxy import sse
from drain_router.proxy.rewrite import CHUNKED, LENGTH, SMALL, UNTIL_CLOSE

SSE = [(b"Content-Type", b"text/event-stream; charset=utf-8")]


@pytest.mark.parametrize(
    ("target", "status", "headers", "expected"),
    [
        (b"/v1/chat/completions", 200, SSE, sse.DONE),
        (b"/v1/completions", 200, SSE, sse.DONE),
        (b"/openai/deployments/m/chat/completions?api-version=1", 200, SSE, sse.DONE),
        (b"/v1/responses", 200, SSE, sse.NAMED),
        (b"/v1/responses?stream=true", 200, [(b"content-type", b"TEXT/EVENT-STREAM")], sse.NAMED),
        (b"/v1/chat/completions", 200, [(b"Content-Type", b"application/json")], sse.NOT_SSE),
        (b"/v1/chat/completions", 200, [], sse.NOT_SSE),
        (b"/v1/chat/completions", 400, SSE, sse.NOT_SSE),
        (b"/v1/chat/completions", 500, SSE, sse.NOT_SSE),
        (b"/generate_stream", 200, SSE, sse.NOT_SSE),
        (b"/v1/completions/extra", 200, SSE, sse.NOT_SSE),
        (b"/v1/models?x=/completions", 200, SSE, sse.NOT_SSE),
    ],
)
def test_kind(target, status, headers, expected):
    assert sse.kind(target, status, headers) == expected


@pytest.mark.parametrize(
    ("stream", "tail", "name", "honest"),
    [
        (sse.DONE, b"data: [DONE]\n\n", None, True),
        (sse.DONE, b'data: {"x": 1}\n\ndata: [DONE]\r\n\r\n', None, True),
        (sse.DONE, b"data:[DONE]\n\n", None, True),
        (sse.DONE, b"data: [DONE]\n", None, True),
        (sse.DONE, b'data: {"x": 1}\n\n', None, False),
        (sse.DONE, b"data: [DON", None, False),
        (sse.DONE, b'data: {"text": "data: [DONE]"}\n\n', None, False),
        (sse.DONE, b"xdata: [DONE]\n\n", None, False),
        (sse.DONE, sse.START, None, False),
        (sse.NAMED, b'"completed"}\n\n', b"response.completed", True),
        (sse.NAMED, b'"failed"}\n\n', b"response.failed", True),
        (sse.NAMED, b'"incomplete"}\n\n', b"response.incomplete", True),
        (sse.NAMED, b'"completed"}', b"response.completed", False),  # its data not whole
        (sse.NAMED, b'"delta"}\n\n', b"response.output_text.delta", False),
        (sse.NAMED, b'"x"}\n\n', None, False),
        (sse.NAMED, b"data: [DONE]\n\n", None, True),
        (sse.NOT_SSE, b"anything", None, True),
    ],
)
def test_ended_honestly(stream, tail, name, honest):
    assert sse.ended_honestly(stream, tail, name) is honest


@pytest.mark.parametrize(
    ("tail", "boundary"),
    [
        (b"data: x\n\n", True),
        (b"data: x\r\n\r\n", True),
        (b"data: x\r\r", True),
        (b"data: x\n", False),
        (b"data: x\r\n", False),
        (b"data: x", False),
        (sse.START, True),
    ],
)
def test_at_boundary(tail, boundary):
    assert sse.at_boundary(tail) is boundary


def test_keep_bounds_the_tail_and_joins_short_pieces():
    middle = b"m" * 100
    assert sse.keep(b"old", [middle]) is middle  # whole, by reference
    big = b"b" * 10_000
    assert sse.keep(b"old", [big]) == big[-sse.TAIL :]
    assert sse.keep(b"x" * 64, [b"ab", b"cd"]) == (b"x" * 64 + b"abcd")[-sse.TAIL :]
    assert sse.keep(b"\n\n", [b"data: [DO", b"NE]\n\n"]) == b"\n\ndata: [DONE]\n\n"


@given(st.lists(st.binary(max_size=700), min_size=1, max_size=12), st.binary(max_size=sse.TAIL))
def test_keep_is_the_last_bytes_of_the_stream(pieces, tail):
    """Whatever the pieces, the tail ends the stream so far (its last TAIL bytes at least, never
    more than TAIL_MAX)."""
    kept = sse.keep(tail, pieces)
    stream = tail + b"".join(pieces)
    assert len(kept) <= sse.TAIL_MAX
    assert stream.endswith(kept) and len(kept) >= min(sse.TAIL, len(stream))


def _feed(stream: int, body: bytes, cuts: list[int]) -> tuple[bytes, bytes | None]:
    tail, name = sse.START, None
    at = 0
    for cut in [*sorted(cuts), len(body)]:
        if cut > at:
            tail, name = sse.advance(stream, tail, name, [body[at:cut]])
            at = cut
    return tail, name


COMPLETED = (
    b'event: response.completed\ndata: {"type": "response.completed", "response": {"x": "' + b"y" * 300 + b'"}}\n\n'
)
DELTA = b'event: response.output_text.delta\ndata: {"delta": "event: response.completed"}\n\n'


@given(st.lists(st.integers(min_value=0, max_value=len(DELTA + COMPLETED)), max_size=6))
def test_a_named_terminal_event_is_found_however_the_stream_is_cut(cuts):
    tail, name = _feed(sse.NAMED, DELTA + COMPLETED, cuts)
    assert name == b"response.completed" and sse.ended_honestly(sse.NAMED, tail, name)
    tail, name = _feed(sse.NAMED, COMPLETED + DELTA, cuts)
    assert not sse.ended_honestly(sse.NAMED, tail, name)


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_done_is_found_however_the_stream_is_cut(cuts):
    body = b'data: {"choices": []}\n\n' * 5 + b"data: [DONE]\n\n"
    tail, _ = _feed(sse.DONE, body, cuts)
    assert sse.ended_honestly(sse.DONE, tail, None)
    tail, _ = _feed(sse.DONE, body[:-14], cuts)
    assert not sse.ended_honestly(sse.DONE, tail, None)


@pytest.mark.parametrize(
    ("window", "name"),
    [
        (b"\nevent: response.completed\ndata: {}", b"response.completed"),
        (b"\nevent:response.failed\r\n", b"response.failed"),
        (b"\revent: a\rdata: x\n\nevent: b\n", b"b"),
        (b"\nevent: response.compl", b""),
        (b'\ndata: {"event: x"}\n', None),
    ],
)
def test_last_event_name(window, name):
    assert sse.last_event_name(window) == name


@pytest.mark.parametrize(
    ("mode", "tail", "written", "cut"),
    [
        (CHUNKED, b"x\n\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse.TRUNCATED_EVENT), sse.TRUNCATED_EVENT), False),
        (CHUNKED, b"data: {", b"", True),
        (UNTIL_CLOSE, b"x\n\n", sse.TRUNCATED_EVENT, False),
        (UNTIL_CLOSE, b"data: {", b"", False),
        (SMALL, b"x\n\n", b"", False),
        (LENGTH, b"x\n\n", b"", False),
    ],
)
def test_truncated_end(mode, tail, written, cut):
    assert sse.truncated_end(mode, tail) == (written, cut)


@pytest.mark.parametrize(
    ("mode", "tail", "written"),
    [
        (CHUNKED, b"x\n\n", b"%x\r\n%s\r\n" % (len(sse.DEADLINE_EVENT), sse.DEADLINE_EVENT)),
        (CHUNKED, b"data: {", b""),
        (UNTIL_CLOSE, b"x\r\n\r\n", sse.DEADLINE_EVENT),
        (LENGTH, b"x\n\n", b""),
    ],
)
def test_deadline_end(mode, tail, written):
    assert sse.deadline_end(mode, tail) == written


@pytest.mark.parametrize("event", [sse.TRUNCATED_EVENT, sse.DEADLINE_EVENT])
def test_the_events_are_errors_the_openai_sdk_raises_on(event):
    """One SSE event named ``error`` whose data is a JSON object with an ``error`` object carrying a
    message (what the SDK's stream raises ``APIError`` on), ending with a blank line."""
    lines = event.split(b"\n")
    assert lines[0] == b"event: error" and lines[1].startswith(b"data: ") and event.endswith(b"\n\n")
    error = json.loads(lines[1][6:])["error"]
    assert isinstance(error["message"], str) and error["type"] in ("upstream_truncated", "drain_deadline")
