"""Honest stream ends, black-box: a real router process, raw client sockets read with h11 (an
independent parser), and a raw model server (:mod:`tests.rawupstream`) that streams server-sent
events in the framing and pieces the test chooses.

A 2xx ``text/event-stream`` answer to an OpenAI-style path that ends without its terminal event
(``data: [DONE]``; for the Responses API ``response.completed``, ``.failed`` or ``.incomplete``)
gets an SSE error event before the end of its body, counts ``upstream_error`` and is logged
truncated; a stream that did end with it, and every other response, is relayed byte for byte. At
the in-flight deadline a stream at an event boundary gets an error event before the cut. The
OpenAI SDK raises on a truncated stream and not on a whole one.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import h11
import openai
import pytest

from drain_router.http1 import sse
from tests import rawupstream, ssegen
from tests.blackbox import by_outcome, requests_total, wait_idle
from tests.process import RouterProcess, Start, router_starter
from tests.rawupstream import Stream


@pytest.fixture
async def raw() -> AsyncIterator[rawupstream.RawUpstream]:
    async with rawupstream.running() as upstream:
        yield upstream


@pytest.fixture
async def start_process(raw) -> AsyncIterator[Start]:
    async with router_starter(raw.url) as start:
        yield start


def _chunk(text: str) -> bytes:
    payload = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


EVENTS = [_chunk("Hel"), _chunk("lo"), _chunk(" world")]
DONE = b"data: [DONE]\n\n"


def _named(name: str, extra: str = "") -> bytes:
    return f'event: {name}\ndata: {{"type": "{name}"{extra}}}\n\n'.encode()


RESPONSES = [_named("response.created"), _named("response.output_text.delta", ', "delta": "Hi"')]
COMPLETED = _named("response.completed", ', "response": {"id": "r1", "status": "completed"}')


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    ended: bool
    """h11 saw the end of the message (False: the connection was cut mid-body)."""


async def _request(p: RouterProcess, target: str, *, version: str = "1.1", timeout: float = 10.0) -> Answer:
    """POST ``target`` and read the answer with h11 until its end or the connection's."""
    assert p.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    conn = h11.Connection(h11.CLIENT)
    body = b'{"model": "m", "stream": true}'
    head = f"POST {target} HTTP/{version}\r\nHost: model\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    # h11 reads the answer: it is told a request went (the bytes above are the ones sent).
    conn.send(h11.Request(method="POST", target=target, headers=[("Host", "model"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    status, headers, data, ended = 0, {}, bytearray(), False
    try:
        async with asyncio.timeout(timeout):
            while not ended:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        conn.receive_data(await reader.read(65536))
                    except ConnectionResetError:
                        conn.receive_data(b"")
                elif isinstance(event, h11.Response):
                    status, headers = event.status_code, dict(event.headers)
                elif isinstance(event, h11.Data):
                    data += event.data
                elif isinstance(event, h11.EndOfMessage):
                    ended = True
    except h11.RemoteProtocolError:
        ended = False  # the connection closed before the message's end
    writer.close()
    return Answer(status, headers, bytes(data), ended)


async def _outcomes(p: RouterProcess) -> dict[str, float]:
    assert p.admin_port is not None
    await wait_idle(p.admin_port)
    return by_outcome(await requests_total(p.admin_port))


def _truncated_events(p: RouterProcess) -> list[dict[str, object]]:
    return [e for e in p.events if e.get("event") == "proxy.stream_truncated"]


# -- chat and completions: data: [DONE] ------------------------------------------------------------


async def test_a_stream_ended_without_done_gets_an_error_event_and_counts_upstream_error(start_process, raw):
    """The model server ends the chunked body cleanly after three events and no ``[DONE]``: the
    client reads the three events, then the error event, then a clean end; ``upstream_error`` with
    status 200; the access log line says truncated, and so does a ``proxy.stream_truncated`` event,
    whose fields and the event's text name nothing internal."""
    raw.stream = Stream(EVENTS)
    p = await start_process("--access-log")
    answer = await _request(p, "/v1/chat/completions")
    assert answer.status == 200 and answer.ended
    assert answer.body == b"".join(EVENTS) + sse.TRUNCATED_EVENT
    error = json.loads(sse.TRUNCATED_EVENT.split(b"data: ", 1)[1])["error"]
    assert error["type"] == "upstream_truncated" and "127.0.0.1" not in error["message"]
    assert await _outcomes(p) == {"upstream_error": 1}
    assert (await requests_total(p.admin_port))[("200", "upstream_error")] == 1
    [access] = [e for e in p.events if e.get("event") == "request"]
    assert access["truncated"] is True and access["outcome"] == "upstream_error"
    [logged] = _truncated_events(p)
    assert logged["error_event"] is True and logged["cut"] is False and logged["path"] == "/v1/chat/completions"


@pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/completions"])
async def test_a_stream_ended_with_done_is_relayed_byte_for_byte(start_process, raw, target):
    raw.stream = Stream([*EVENTS, DONE])
    p = await start_process("--access-log")
    answer = await _request(p, target)
    assert answer.status == 200 and answer.ended and answer.body == b"".join(EVENTS) + DONE
    assert await _outcomes(p) == {"completed": 1}
    [access] = [e for e in p.events if e.get("event") == "request"]
    assert "truncated" not in access and not _truncated_events(p)


async def test_done_split_across_reads_and_chunks_at_every_position_is_recognised(start_process, raw):
    """The terminal event split in two at every position (and with CRLF line ends), each half its
    own chunk: written one read apart, and both in one read (two chunks llhttp hands over apart)."""
    p = await start_process()
    cases = 0
    for terminal in (DONE, b"data: [DONE]\r\n\r\n", b"data:[DONE]\n\n"):
        for at in range(1, len(terminal)):
            for pause in (0.01, 0.0):
                raw.stream = Stream([EVENTS[0], terminal[:at], terminal[at:]], pause=pause)
                answer = await _request(p, "/v1/completions")
                assert answer.ended and answer.body == EVENTS[0] + terminal, (terminal, at, pause)
                cases += 1
    assert await _outcomes(p) == {"completed": cases}
    assert not _truncated_events(p)


async def test_a_stream_cut_mid_event_at_a_clean_end_is_cut_for_the_client(start_process, raw):
    """The body ends cleanly inside an event: appending would complete the partial event, so the
    client connection is cut without the last chunk (an SSE client drops the partial event)."""
    raw.stream = Stream([EVENTS[0], b'data: {"id": "c1", "choi'])
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions")
    assert answer.status == 200 and not answer.ended
    assert answer.body == EVENTS[0] + b'data: {"id": "c1", "choi'
    assert await _outcomes(p) == {"upstream_error": 1}
    [logged] = _truncated_events(p)
    assert logged["error_event"] is False and logged["cut"] is True


async def test_an_upstream_lost_after_done_ends_the_stream_cleanly_and_counts_completed(start_process, raw):
    """The model server's connection closes after ``data: [DONE]`` but before the last chunk (a
    crash between its last two writes): the client has the whole answer, so it gets the last chunk
    (no cut an SDK would raise on), and the router counts the stream completed and logs the cut."""
    raw.stream = Stream([*EVENTS, DONE], framing="cut")
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions")
    assert answer.status == 200 and answer.ended
    assert answer.body == b"".join(EVENTS) + DONE
    assert await _outcomes(p) == {"completed": 1}
    assert [e["path"] for e in p.events if e.get("event") == "proxy.upstream_cut_after_end"] == ["/v1/chat/completions"]


async def test_an_upstream_lost_before_done_cuts_the_client(start_process, raw):
    """The same cut before ``data: [DONE]``: the client's connection is cut too (no last chunk)
    and the stream counts upstream_error."""
    raw.stream = Stream(EVENTS, framing="cut")
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions")
    assert answer.status == 200 and not answer.ended
    assert answer.body == b"".join(EVENTS)
    assert await _outcomes(p) == {"upstream_error": 1}


async def test_a_close_delimited_stream_to_an_http10_client_gets_the_event_before_the_close(start_process, raw):
    raw.stream = Stream(EVENTS, framing="close")
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions", version="1.0")
    assert answer.status == 200 and answer.ended
    assert answer.body == b"".join(EVENTS) + sse.TRUNCATED_EVENT
    assert await _outcomes(p) == {"upstream_error": 1}


async def test_a_close_delimited_stream_is_rechunked_with_the_event(start_process, raw):
    raw.stream = Stream(EVENTS, framing="close")
    p = await start_process()
    answer = await _request(p, "/v1/completions")
    assert answer.ended and answer.body == b"".join(EVENTS) + sse.TRUNCATED_EVENT
    assert await _outcomes(p) == {"upstream_error": 1}


@pytest.mark.parametrize("size", [100, 70_000], ids=["small", "large"])
async def test_a_stream_of_known_length_cannot_be_extended_only_counted_and_logged(start_process, raw, size):
    """A Content-Length body cannot carry one more event: the client gets exactly the model
    server's bytes; the outcome and the log still say truncated."""
    events = [b"data: " + b"x" * (size - 8) + b"\n\n"]
    raw.stream = Stream(events, framing="length")
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions")
    assert answer.ended and answer.body == events[0]
    assert await _outcomes(p) == {"upstream_error": 1}
    [logged] = _truncated_events(p)
    assert logged["error_event"] is False and logged["cut"] is False


@pytest.mark.parametrize(
    ("target", "stream"),
    [
        ("/v1/chat/completions", Stream([b'{"id": "c1", "choices": []}'], content_type=b"application/json")),
        ("/v1/chat/completions", Stream([b'data: {"error": {"message": "bad"}}\n\n'], status=400)),
        ("/sse", Stream(EVENTS)),  # an SSE path whose terminal event the router does not know
        ("/v1/chat/completions", Stream(EVENTS, content_type=b"text/plain")),
    ],
    ids=["json", "4xx-sse", "other-path", "not-sse"],
)
async def test_other_responses_are_untouched(start_process, raw, target, stream):
    raw.stream = stream
    p = await start_process()
    answer = await _request(p, target)
    assert answer.status == stream.status and answer.ended and answer.body == b"".join(stream.pieces)
    assert await _outcomes(p) == {"completed": 1}
    assert not _truncated_events(p)


# -- the Responses API: named terminal events ------------------------------------------------------


@pytest.mark.parametrize("name", ["response.completed", "response.failed", "response.incomplete"])
async def test_a_responses_stream_with_its_terminal_event_is_untouched(start_process, raw, name):
    terminal = _named(name, ', "response": {"id": "r1", "output": "' + "long " * 400 + '"}')
    raw.stream = Stream([*RESPONSES, terminal])
    p = await start_process()
    answer = await _request(p, "/v1/responses")
    assert answer.ended and answer.body == b"".join(RESPONSES) + terminal
    assert await _outcomes(p) == {"completed": 1}


async def test_a_responses_stream_without_its_terminal_event_gets_the_error_event(start_process, raw):
    raw.stream = Stream([*RESPONSES, _named("response.output_text.done")])
    p = await start_process()
    answer = await _request(p, "/v1/responses")
    assert answer.ended and answer.body == b"".join(RESPONSES) + _named("response.output_text.done") + (
        sse.TRUNCATED_EVENT
    )
    assert await _outcomes(p) == {"upstream_error": 1}


async def test_a_named_terminal_event_split_at_every_position_is_recognised(start_process, raw):
    p = await start_process()
    cases = 0
    for at in range(1, len(COMPLETED)):
        for pause in (0.005, 0.0):
            raw.stream = Stream([RESPONSES[0], COMPLETED[:at], COMPLETED[at:]], pause=pause)
            answer = await _request(p, "/v1/responses")
            assert answer.ended and answer.body == RESPONSES[0] + COMPLETED, (at, pause)
            cases += 1
    assert await _outcomes(p) == {"completed": cases}


# -- the in-flight deadline --------------------------------------------------------------------------


@pytest.mark.parametrize("boundary", [True, False], ids=["at-boundary", "mid-event"])
async def test_at_the_deadline_a_stream_at_an_event_boundary_gets_the_error_event(start_process, raw, boundary):
    """A stream held open past the drain deadline (window 1 s, grace 3 s): at an event boundary the
    client gets the deadline's error event and then the cut (no last chunk); mid-event only the cut."""
    pieces = [*EVENTS] if boundary else [*EVENTS, b'data: {"id": "c1", "choi']
    raw.stream = Stream(pieces, hold=True)
    p = await start_process("--termination-grace-secs", "3", "--access-log", drain_secs="1")
    pending = asyncio.ensure_future(_request(p, "/v1/chat/completions"))
    await asyncio.wait_for(raw.stream_held.wait(), 5)
    await asyncio.sleep(0.2)
    p.signal()
    answer = await pending
    assert answer.status == 200 and not answer.ended
    assert answer.body == b"".join(pieces) + (sse.DEADLINE_EVENT if boundary else b"")
    assert await p.wait() == 1
    [access] = [e for e in p.events if e.get("event") == "request"]
    assert access["outcome"] == "deadline_aborted" and "truncated" not in access


# -- the OpenAI SDK --------------------------------------------------------------------------------


def _sdk_stream(port: int) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    text = []
    for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
        text.append(chunk.choices[0].delta.content or "")
    return "".join(text)


async def test_the_openai_sdk_raises_on_a_truncated_stream_and_not_on_a_whole_one(start_process, raw):
    p = await start_process()
    assert p.port is not None
    raw.stream = Stream([*EVENTS, DONE])
    assert await asyncio.to_thread(_sdk_stream, p.port) == "Hello world"
    raw.stream = Stream(EVENTS)
    with pytest.raises(openai.APIError, match="without its terminal event"):
        await asyncio.to_thread(_sdk_stream, p.port)


# -- generated streams, judged by the OpenAI SDK's decoder -----------------------------------------

GENERATED = 40
"""Streams per framing: each a generated body in generated reads (a seeded generator: the same
streams every run)."""


def _generated(seed: int) -> tuple[bytes, list[bytes]]:
    rng = random.Random(seed)
    body = ssegen.stream(rng.choice, rng.randint)
    return body, ssegen.reads(body, [rng.randint(0, max(len(body), 1)) for _ in range(rng.randint(0, 5))])


@pytest.mark.parametrize("framing", ["chunked", "length"])
async def test_generated_streams_end_as_the_openai_sdk_reads_them(start_process, raw, framing):
    """1. A raw model server answers each of 40 generated streams (comments, ids, retries, [DONE] in
    its variants, more after it, cut anywhere) in generated reads, chunked or with a Content-Length.
    Result: the router adds its error event (or cuts a chunked body) exactly when the OpenAI SDK's
    decoder, fed the model server's bytes, stops at no [DONE] event; a stream it would stop on is
    relayed byte for byte and counted completed, whatever follows its [DONE]."""
    p = await start_process()
    expected = {"completed": 0, "upstream_error": 0}
    for seed in range(GENERATED):
        body, pieces = _generated(seed)
        if not pieces:
            continue
        honest = ssegen.sdk_saw_done(pieces)
        raw.stream = Stream(pieces, framing=framing, pause=0.005)
        answer = await _request(p, "/v1/chat/completions")
        assert answer.status == 200, seed
        if honest or framing == "length":
            assert answer.ended and answer.body == body, (seed, body)
        else:
            assert answer.body != body or not answer.ended, (seed, body)
            assert answer.body.startswith(body), (seed, body)
        expected["completed" if honest else "upstream_error"] += 1
    assert await _outcomes(p) == {k: v for k, v in expected.items() if v}
    assert expected["completed"] and expected["upstream_error"], "the seeds give both kinds"


# -- streams that ended properly, in the shapes the SDK stops on -----------------------------------

AFTER_DONE = {
    "trailing-space": [*EVENTS, b"data: [DONE] \n\n"],
    "comment-after": [*EVENTS, DONE, b": keep-alive\n\n"],
    "id-after": [*EVENTS, DONE, b"id: 7\n"],
    "events-after": [*EVENTS, DONE, *EVENTS, *EVENTS],
    "crlf-split-cr": [EVENTS[0], b"data: [DONE]\r", b"\n\r", b"\n"],
    "done-in-many-reads": [EVENTS[0], *(bytes([b]) for b in DONE)],
}


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
@pytest.mark.parametrize("shape", sorted(AFTER_DONE))
async def test_a_stream_the_sdk_stops_on_is_never_given_the_error(start_process, raw, shape, framing):
    """A stream whose ``[DONE]`` event the OpenAI SDK dispatches (with a trailing space, followed by
    a comment, an ``id:`` line or more events, its line ends split across reads), each piece its own
    read: relayed byte for byte, no error event, counted completed."""
    pieces = AFTER_DONE[shape]
    assert ssegen.sdk_saw_done(pieces)
    raw.stream = Stream(pieces, framing=framing, pause=0.01)
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions", version="1.0" if framing == "close" else "1.1")
    assert answer.status == 200 and answer.ended and answer.body == b"".join(pieces)
    assert b"upstream_truncated" not in answer.body
    assert await _outcomes(p) == {"completed": 1}
    assert not _truncated_events(p)


@pytest.mark.parametrize("before", [b"", EVENTS[0]], ids=["alone", "after-an-event"])
@pytest.mark.parametrize("at", range(1, len(DONE)))
async def test_a_small_body_of_known_length_split_inside_done_is_whole(start_process, raw, at, before):
    """A small body with a Content-Length that arrives in two reads split inside its terminal event
    (``data: [DO`` then ``NE]``): the router judges the body, not its reads, and counts it completed;
    the same body without its last blank line counts upstream_error."""
    p = await start_process()
    for body in (before + DONE, before + DONE[:-1]):
        raw.stream = Stream([body[: len(before) + at], body[len(before) + at :]], framing="length", pause=0.01)
        answer = await _request(p, "/v1/chat/completions")
        assert answer.ended and answer.body == body
    assert await _outcomes(p) == {"completed": 1, "upstream_error": 1}
    [logged] = _truncated_events(p)
    assert logged["error_event"] is False


NOT_DONE = {
    # what the client gets after the model server's bytes: the error event, or (mid-event) the cut
    "no-done": ([*EVENTS], "event"),
    "done-as-second-data-line": ([EVENTS[0], b"data: x\r", b"\ndata: [DONE]\n\n"], "event"),
    "done-in-a-comment": ([*EVENTS, b": data: [DONE]\n\n"], "event"),
    "done-lowercase": ([*EVENTS, b"data: [done]\n\n"], "event"),
    "done-not-dispatched": ([*EVENTS, b"data: [DONE]\r", b"\n"], "cut"),
}


@pytest.mark.parametrize("shape", sorted(NOT_DONE))
async def test_a_stream_the_sdk_does_not_stop_on_still_gets_the_error(start_process, raw, shape):
    """Truly truncated streams, among them ones whose reads split a CRLF (the SDK's decoder reads
    ``data: x`` CR, LF ``data: [DONE]`` as one event with two data lines): the error event at an
    event boundary, the cut mid-event; counted upstream_error either way."""
    pieces, expected = NOT_DONE[shape]
    assert not ssegen.sdk_saw_done(pieces)
    raw.stream = Stream(pieces, pause=0.01)
    p = await start_process()
    answer = await _request(p, "/v1/chat/completions")
    if expected == "event":
        assert answer.ended and answer.body == b"".join(pieces) + sse.TRUNCATED_EVENT
    else:
        assert not answer.ended and answer.body == b"".join(pieces)
    assert await _outcomes(p) == {"upstream_error": 1}
    [logged] = _truncated_events(p)
    assert logged["cut"] is (expected == "cut")
