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
        end.feed(read)
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
        (sse.DONE, b"data: [DONE]  \n\n", True),
        (sse.DONE, b"data: [DONE]\n\n: keep-alive\n", True),
        (sse.DONE, b"data: [DONE]\n\nid: 7\n\n", True),
        (sse.DONE, b"data: [DONE]\n\n" + b'data: {"x": 1}\n\n' * 200, True),  # far beyond any window
        (sse.DONE, b"data: [DONE]\n\ndata: [DO", True),
        (sse.DONE, b"event: x\ndata: [DONE]\n\n", True),  # its name does not matter
        (sse.DONE, b"data:[DONE]" + b" " * 100 + b"\n\n", True),  # a line longer than what is kept
        (sse.DONE, b"data: [DONE]\r\n\r", True),
        (sse.DONE, b"data: [DONE]\r\r\n", True),  # CR, then CRLF: two line ends
        (sse.DONE, b"data: [DONE]\r\n", False),  # one line end
        (sse.DONE, b"data: [DONE]\n", False),  # never dispatched: the SDK never saw it
        (sse.DONE, b'data: {"x": 1}\n\n', False),
        (sse.DONE, b"data: [DON", False),
        (sse.DONE, b'data: {"text": "data: [DONE]"}\n\n', False),
        (sse.DONE, b"xdata: [DONE]\n\n", False),
        (sse.DONE, b"data: x\ndata: [DONE]\n\n", False),  # its data is "x\n[DONE]"
        (sse.DONE, b"data:  [DONE]\n\n", False),  # one space is dropped, not two
        (sse.DONE, b": data: [DONE]\n\n", False),
        (sse.DONE, b"", False),
        (sse.DONE, b"data: [done]\n\n", False),
        (sse.DONE, b"data\ndata: [DONE]\n\n", False),  # "data" alone is an empty data line
        (sse.DONE, b"data: x\r\ndata: [DONE]\n\n", False),
        (sse.DONE, b"data: " + b"x" * 100 + b"\ndata: [DONE]\n\n", False),
        (sse.DONE, b"data: [DONE]x" + b"\n" * 0, False),
        (sse.NAMED, b'event: response.completed\ndata: {"type": "response.completed"}\n\n', True),
        (sse.NAMED, b"event: response.failed\ndata: {}\r\n\r\n", True),
        (sse.NAMED, b"event: response.incomplete\ndata: {}\n\n", True),
        (sse.NAMED, b'event: response.completed\ndata: {"x": 1}', False),  # its data not whole
        (sse.NAMED, b"event: response.output_text.delta\ndata: {}\n\n", False),
        (sse.NAMED, b"data: {}\n\n", False),
        (sse.NAMED, b"data: [DONE]\n\n", True),
        (sse.NAMED, b"event: response.completed\ndata: {}\n\n: keep-alive\n\ndata: {}\n\n", True),
        (sse.NAMED, b"event: response.completed\ndata: {}\n\ndata: {}\n", True),  # junk after it
        (sse.NAMED, b"event: response.completed\ndata: {}\n\nevent: response.created\n\n", False),
        (sse.NAMED, b"event: response.completed\ndata: {}\n\nevent:\ndata: {}\n\n", True),  # unnamed
        (sse.NAMED, b"event: response.completed \ndata: {}\n\n", False),  # the name is "response.completed "
        (sse.NAMED, b"event: response.completed\revent: response.created\r\r", False),  # the last name
        (sse.NAMED, b"event: response.created\revent: response.failed\r\n\r\n", True),
        (sse.NAMED, b"event: response.completed", False),
    ],
)
def test_ended_honestly(kind, body, honest):
    assert _end(kind, body).ended_honestly() is honest
    if body:  # the same, however it is cut into reads
        assert _end(kind, *(body[i : i + 1] for i in range(len(body)))).ended_honestly() is honest


@pytest.mark.parametrize(
    ("reads", "honest"),
    [
        ((b"data: [DO", b"NE]\n\n"), True),
        ((b'data: {"x": 1}\n\ndata: [DO', b"NE]\n", b"\n"), True),
        ((b"data: [DONE]\r", b"\n\r", b"\n"), True),
        ((b"data: [DONE]\r", b"\n"), False),  # a CRLF split between reads is one line end
        ((b"data: x\r", b"\ndata: [DONE]\n\n"), False),  # so [DONE] is the event's second data line
        ((b"data: x\r", b"\rdata: [DONE]\n\n"), True),
        ((b"da", b"ta: [DONE]\n\n"), True),
        ((b"data: [DONE]", b"\n\n"), True),
        ((b'data: {"x": 1}\n\n', b"data: [DONE]\n\n", *(b'data: {"x": 2}\n\n',) * 50), True),
        ((b"data: x", b"\n\n", b"data: [DONE]"), False),
        ((b"data: x\n", b"\n"), False),
    ],
)
def test_ended_honestly_across_reads(reads, honest):
    """Reads split inside the terminator, inside a CRLF, or followed by many more reads."""
    assert _end(sse.DONE, *reads).ended_honestly() is honest
    assert _end(sse.DONE, b"".join(reads)).ended_honestly() is honest


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
        (b"data: x\n\n: c\n", True),  # a comment gathers nothing
        (b"data: x\n\nid: 3\n", True),
        (b"data: x\n\n: c", False),  # a partial line
        (b"data: x\n\r", True),
    ],
)
def test_at_boundary(body, boundary):
    assert _end(sse.DONE, *([body] if body else [])).at_boundary() is boundary


def test_what_is_kept_is_bounded_whatever_the_stream():
    """A line still arriving is kept to its first bytes; nothing else grows with the stream."""
    end = sse.StreamEnd(sse.DONE)
    end.feed(b"data: [DONE]")
    for _ in range(1000):
        end.feed(b"x" * 1000)
    assert len(end.line) == sse.LINE_PREFIX
    end.feed(b"\n\n")
    assert end.ended_honestly() and end.line == b""


def test_a_quick_stream_stays_quick_on_whole_events():
    """The hot path: reads of whole events at a boundary leave a DONE stream quick (nothing stored)."""
    end = sse.StreamEnd(sse.DONE)
    for i in range(100):
        read = b'data: {"i": %d}\n\n' % i
        assert sse.StreamEnd.keeps(read)
        end.feed(read)
        assert end.quick
    end.feed(b"data: [DONE]\n\n")
    assert not sse.StreamEnd.keeps(b"data: [DONE]\n\n") and end.ended_honestly()
    assert not sse.StreamEnd.keeps(b"data: x\n") and not sse.StreamEnd.keeps(b"data: x\r\n\r\n")
    for read in (b"data: x\r\n\n", b": c\r\rdata: y\n\n", b"data: x\r\n\r\n\n"):
        # CRs before the LF LF: what keeps() promises, the decoder line by line agrees with.
        assert sse.StreamEnd.keeps(read)
        end = sse.StreamEnd(sse.DONE)
        end._decode(read)
        assert end.quick and not end.done, read


# -- the OpenAI SDK as the oracle ------------------------------------------------------------------


def _cuts(data: st.DataObject, body: bytes) -> list[int]:
    """Where a body is cut into reads: anywhere, after each CR (a CRLF split), or between every two bytes."""
    return data.draw(
        st.one_of(
            st.lists(st.integers(0, len(body)), max_size=8),
            st.just([i + 1 for i, b in enumerate(body) if b == 13]),
            st.just(list(range(len(body)))),
        )
    )


@given(st.data())
@settings(max_examples=500)
def test_a_stream_ended_as_the_openai_sdk_decoder_reads_it(data):
    body = ssegen.stream(
        lambda options: data.draw(st.sampled_from(options)), lambda lo, hi: data.draw(st.integers(lo, hi))
    )
    pieces = ssegen.reads(body, _cuts(data, body))
    end = sse.StreamEnd(sse.DONE)
    for piece in pieces:
        end.feed(piece)
    assert end.ended_honestly() is ssegen.sdk_saw_done(pieces), (body, pieces)
    whole = sse.StreamEnd(sse.DONE)
    whole.feed(body)
    assert whole.ended_honestly() is end.ended_honestly()


@given(st.data())
@settings(max_examples=300)
def test_a_responses_stream_ended_as_the_openai_sdk_decoder_reads_it(data):
    body = ssegen.named_stream(
        lambda options: data.draw(st.sampled_from(options)), lambda lo, hi: data.draw(st.integers(lo, hi))
    )
    pieces = ssegen.reads(body, _cuts(data, body))
    end = sse.StreamEnd(sse.NAMED)
    for piece in pieces:
        end.feed(piece)
    assert end.ended_honestly() is ssegen.sdk_saw_terminal(pieces), (body, pieces)


@given(st.data())
@settings(max_examples=200)
def test_an_error_event_appended_at_a_boundary_is_read_as_one_of_its_own(data):
    """Where the state says "at a boundary", the SDK's decoder reads an appended error event whole,
    with its own data; where it does not, the stream ends inside an event or a line."""
    body = ssegen.stream(
        lambda options: data.draw(st.sampled_from(options)), lambda lo, hi: data.draw(st.integers(lo, hi))
    )
    end = sse.StreamEnd(sse.DONE)
    for piece in ssegen.reads(body, _cuts(data, body)):
        end.feed(piece)
    events = list(ssegen.SSEDecoder().iter_bytes(iter([body, sse.TRUNCATED_EVENT])))
    appended = [e for e in events if e.event == "error" and e.data == sse.TRUNCATED_EVENT[19:-2].decode()]
    assert bool(appended) is end.at_boundary(), body


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
                end.feed(body[a:b])
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
