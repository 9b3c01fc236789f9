"""The bench upstream's streams, read by an independent parser (h11): what a workload claims to send
is what it sends."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import pytest

from bench import upstream


class Recording(asyncio.Transport):
    """Keeps each write apart, so a test sees how the upstream wrote a response."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        pass


def _events(wire: bytes) -> list[bytes]:
    """The SSE events of one chunked response (h11: the framing is checked, not trusted)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "t")]))
    conn.receive_data(wire)
    body = b""
    while (event := conn.next_event()) is not h11.NEED_DATA:
        if isinstance(event, h11.Data):
            body += event.data
        if isinstance(event, h11.EndOfMessage):
            break
    else:
        pytest.fail("the response did not end")
    return [e for e in body.split(b"\n\n") if e]


@pytest.mark.parametrize(("query", "writes"), [("chunks=64&oneread=1", 1), ("chunks=64&interval_ms=0", 66)])
def test_a_stream_in_one_read_is_one_write_and_a_burst_is_one_write_per_event(query, writes):
    """1. ``/v1/completions`` asked for 64 events, in one write or back to back.
    Result: 64 events and ``[DONE]`` either way; the one-read stream is one write (the head, every
    event and the end), the burst one write per event (the head with the first)."""
    proto = upstream.UpstreamProtocol()
    transport = Recording()
    proto.connection_made(transport)
    proto.data_received(b"GET /v1/completions?%s HTTP/1.1\r\nHost: t\r\n\r\n" % query.encode())
    events = _events(b"".join(transport.writes))
    assert len(events) == 65 and events[-1] == b"data: [DONE]"
    assert len(transport.writes) == writes


def test_a_posted_request_gets_its_stream_and_done_0_ends_it_without_done():
    """1. ``POST /v1/completions`` with a JSON body (the followed workload's), asked for 8 events and
    ``done=0``, then a second request on the same connection.
    Result: the body is read and the stream is whole (h11 sees its end) with 8 events and no
    ``[DONE]``; the connection serves the next request."""
    proto = upstream.UpstreamProtocol()
    transport = Recording()
    proto.connection_made(transport)
    body = b'{"model":"bench","prompt":"hi","stream":true,"max_tokens":8}'
    head = b"POST /v1/completions?chunks=8&interval_ms=0&done=0 HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
    proto.data_received(head % len(body) + body + b"GET /small HTTP/1.1\r\nHost: t\r\n\r\n")
    wire = b"".join(transport.writes)
    stream, _, rest = wire.partition(b"0\r\n\r\n")
    events = _events(stream + b"0\r\n\r\n")
    assert len(events) == 8 and all(e.startswith(b'data: {"id"') for e in events)
    assert rest == upstream.SMALL_RESPONSE
