"""The refusal marker: an answer of the router's own to a request the model server never saw carries
``x-drain-router-refused: <reason>`` (a tier above may send that request to another replica), and no
other answer does: not the model server's own answers, not a 502 for a response cut after the
request reached it, and never one the model server wrote the header into itself.

Admission's refusals (queue full, queue timeout, closing) are checked in tests/admission, the
connection-limit refusal in tests/cli/test_emfile.py, gRPC's in tests/admission/test_grpc.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from drain_router_dev.process import free_port

MARKER = "x-drain-router-refused"


async def test_no_upstream_connection_is_a_marked_502(start_router, http):
    r = await start_router(upstream=f"http://127.0.0.1:{free_port()}")
    async with http.post(f"{r.url}/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 502
        assert resp.headers[MARKER] == "upstream_unavailable"
        assert (await resp.json())["error"]["type"] == "upstream_unavailable"


async def test_a_response_cut_after_the_request_reached_the_model_server_is_not_marked(
    fake_upstream, start_router, http
):
    r = await start_router(upstream=fake_upstream.url)
    async with http.get(f"{r.url}/short") as resp:
        assert resp.status == 502
        assert MARKER not in resp.headers  # the model server saw it: a retry could run it twice


async def test_the_model_servers_own_refusals_are_not_marked(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    for code in (429, 503):
        async with http.get(f"{r.url}/status/{code}") as resp:
            assert resp.status == code and MARKER not in resp.headers


@pytest.fixture(params=[False, True], ids=["plain", "connection-names-a-header"])
async def marking_upstream(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A model server that writes the marker into its own 503 (a hostile or confused one), with a
    header of its own to keep; and, in one variant, a ``Connection`` header naming another header
    (the router then rebuilds the head without the headers it names)."""
    named = b"Connection: x-hop\r\nX-Hop: 1\r\n" if request.param else b""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nX-Drain-Router-Refused: closing\r\n"
            + named
            + b"X-Kept: yes\r\nContent-Length: 2\r\n\r\n{}"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_the_marker_is_never_the_model_servers_to_give(marking_upstream, start_router, http):
    """1. the model server answers 503 with ``X-Drain-Router-Refused: closing``. Result: the client
    gets its 503 and its own header, without the marker: the request was run, and a tier above must
    not run it again."""
    r = await start_router(upstream=marking_upstream)
    async with http.post(f"{r.url}/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 503
        assert resp.headers["x-kept"] == "yes" and "x-hop" not in resp.headers
        assert MARKER not in resp.headers
