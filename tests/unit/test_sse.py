"""The pure rules of honest stream ends (:mod:`drain_router.http1.sse`), table by table: which
responses are streams with a known terminal event, what is kept of a stream, what counts as ended;
and, with generated streams cut into generated reads, the OpenAI SDK's own decoder as the oracle of
whether a stream ended with its terminal event."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drain_router.http1 import sse
from drain_router.http1.heads import CHUNKED, LENGTH, SMALL, UNTIL_CLOSE
from tests import ssegen

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


def _end(kind: int, *reads: bytes) -> sse.StreamEnd:
    end = sse.StreamEnd(kind)
    for read in reads:
        end.feed([read], 0)
    return end


@pytest.mark.parametrize(
    ("kind", "body", "honest"),
    [
        (sse.DONE, b"data: [DONE]\n\n", True),
        (sse.DONE, b'data: {"x": 1}\n\ndata: [DONE]\r\n\r\n', True),
        (sse.DONE, b"data:[DONE]\n\n", True),
        (sse.DONE, b"data: [DONE] \n\n", True),  # a trailing space: the data still starts with [DONE]
        (sse.DONE, b"data: [DONE]\n\n: keep-alive\n\n", True),  # the SDK stopped reading at [DONE]
        (sse.DONE, b"data: [DONE]\n\nid: 7\n", True),
        (sse.DONE, b'data: [DONE]\n\ndata: {"x": 1}\n\n', True),
        (sse.DONE, b"id: 1\ndata: [DONE]\nretry: 5\n\n", True),
        (sse.DONE, b": hi\r\ndata: [DONE]\r\r", True),
        (sse.DONE, b"data: [DONE]\n", False),  # never dispatched: the SDK never saw it
        (sse.DONE, b'data: {"x": 1}\n\n', False),
        (sse.DONE, b"data: [DON", False),
        (sse.DONE, b'data: {"text": "data: [DONE]"}\n\n', False),
        (sse.DONE, b"xdata: [DONE]\n\n", False),
        (sse.DONE, b"data: x\ndata: [DONE]\n\n", False),  # its data is "x\n[DONE]"
        (sse.DONE, b"data:  [DONE]\n\n", False),  # one space is dropped, not two
        (sse.DONE, b": data: [DONE]\n\n", False),
        (sse.DONE, b"", False),
        (sse.NAMED, b'event: response.completed\ndata: {"type": "response.completed"}\n\n', True),
        (sse.NAMED, b"event: response.failed\ndata: {}\r\n\r\n", True),
        (sse.NAMED, b"event: response.incomplete\ndata: {}\n\n", True),
        (sse.NAMED, b'event: response.completed\ndata: {"x": 1}', False),  # its data not whole
        (sse.NAMED, b"event: response.output_text.delta\ndata: {}\n\n", False),
        (sse.NAMED, b"data: {}\n\n", False),
        (sse.NAMED, b"data: [DONE]\n\n", True),
    ],
)
def test_ended_honestly(kind, body, honest):
    assert _end(kind, body).ended_honestly() is honest
    if body:  # the same, however it is cut into reads
        assert _end(kind, *(body[i : i + 1] for i in range(len(body)))).ended_honestly() is honest


@pytest.mark.parametrize(
    ("body", "boundary"),
    [
        (b"data: x\n\n", True),
        (b"data: x\r\n\r\n", True),
        (b"data: x\r\r", True),
        (b"data: x\n", False),
        (b"data: x\r\n", False),
        (b"data: x", False),
        (b"", True),
    ],
)
def test_at_boundary(body, boundary):
    assert _end(sse.DONE, *([body] if body else [])).at_boundary() is boundary


def test_reads_are_kept_by_reference_and_what_is_kept_is_bounded():
    end = sse.StreamEnd(sse.DONE)
    pieces = [b'data: {"i": %d, "pad": "%s"}\n\n' % (i, b"x" * 60) for i in range(1000)]
    for piece in pieces:
        end.feed([piece], 0)
    assert end.last is pieces[-1] and end.prev is pieces[-2]  # no copies
    big = b"x" * 100_000 + b"\n\ndata: [DONE]\n\n"
    end.feed([big], 0)
    assert len(end.last) == sse.WINDOW and end.ended_honestly()  # a big read costs a window, not itself
    for _ in range(100):
        end.feed([b"\n"], 0)  # short pieces are joined, within bounds
    assert len(end.last) <= sse.WINDOW + 1 and end.ended_honestly()


def test_a_read_of_many_pieces_keeps_only_what_the_window_needs():
    end = sse.StreamEnd(sse.DONE)
    out = [b"HEAD", *(b'data: {"i": %d}\n\n' % i for i in range(500)), b"data: [DONE]\n\n"]
    end.feed(out, 1)
    assert end.ended_honestly() and len(end.prev + end.last) < sse.WINDOW + 40
    assert end.seen == sum(map(len, out[1:]))


# -- the OpenAI SDK as the oracle ------------------------------------------------------------------


@given(st.data(), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
@settings(max_examples=400)
def test_a_stream_ended_as_the_openai_sdk_decoder_reads_it(data, cuts):
    body = ssegen.stream(
        lambda options: data.draw(st.sampled_from(options)), lambda lo, hi: data.draw(st.integers(lo, hi))
    )
    pieces = ssegen.reads(body, cuts)
    end = sse.StreamEnd(sse.DONE)
    for piece in pieces:
        end.feed([piece], 0)
    assert end.ended_honestly() is ssegen.sdk_saw_done(pieces), body


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


COMPLETED = (
    b'event: response.completed\ndata: {"type": "response.completed", "response": {"x": "' + b"y" * 3000 + b'"}}\n\n'
)
DELTA = b'event: response.output_text.delta\ndata: {"delta": "event: response.completed"}\n\n'


@given(st.lists(st.integers(min_value=0, max_value=len(DELTA + COMPLETED)), max_size=6))
def test_a_named_terminal_event_longer_than_the_window_is_found_however_the_stream_is_cut(cuts):
    def fed(body: bytes) -> sse.StreamEnd:
        end = sse.StreamEnd(sse.NAMED)
        points = sorted({0, *(c for c in cuts if c < len(body)), len(body)})
        for a, b in itertools.pairwise(points):
            if b > a:
                end.feed([body[a:b]], 0)
        return end

    assert fed(DELTA + COMPLETED).ended_honestly()
    assert not fed(COMPLETED + DELTA).ended_honestly()


@pytest.mark.parametrize(
    ("mode", "boundary", "written", "cut"),
    [
        (CHUNKED, True, b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse.TRUNCATED_EVENT), sse.TRUNCATED_EVENT), False),
        (CHUNKED, False, b"", True),
        (UNTIL_CLOSE, True, sse.TRUNCATED_EVENT, False),
        (UNTIL_CLOSE, False, b"", False),
        (SMALL, True, b"", False),
        (LENGTH, True, b"", False),
    ],
)
def test_truncated_end(mode, boundary, written, cut):
    assert sse.truncated_end(mode, boundary) == (written, cut)


@pytest.mark.parametrize(
    ("mode", "boundary", "written"),
    [
        (CHUNKED, True, b"%x\r\n%s\r\n" % (len(sse.DEADLINE_EVENT), sse.DEADLINE_EVENT)),
        (CHUNKED, False, b""),
        (UNTIL_CLOSE, True, sse.DEADLINE_EVENT),
        (LENGTH, True, b""),
    ],
)
def test_deadline_end(mode, boundary, written):
    assert sse.deadline_end(mode, boundary) == written


@pytest.mark.parametrize("event", [sse.TRUNCATED_EVENT, sse.DEADLINE_EVENT])
def test_the_events_are_errors_the_openai_sdk_raises_on(event):
    """One SSE event named ``error`` whose data is a JSON object with an ``error`` object carrying a
    message (what the SDK's stream raises ``APIError`` on), ending with a blank line."""
    lines = event.split(b"\n")
    assert lines[0] == b"event: error" and lines[1].startswith(b"data: ") and event.endswith(b"\n\n")
    error = json.loads(lines[1][6:])["error"]
    assert isinstance(error["message"], str) and error["type"] in ("upstream_truncated", "drain_deadline")
