"""Responses that have no content whatever their ``content-length`` says (RFC 9113 §8.1.1, RFC 9110
§6.4.1): the answer to a HEAD request, 204 and 304. A real router process relays h2c streams to a real
HTTP/2 server (nghttpd, whose HEAD answers carry the file's ``content-length`` and no DATA) and to a
stand-in; the client is raw frames (tests/h2client.py). The client's stream ends when the model server
ends it, with no reset, and the call is ``completed``. Every other response is still held to its
``content-length``, and content on a response that has none is never relayed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hyperframe import frame as hf

from drain_router_dev.process import wait_until
from tests import nghttpd, rawh2upstream
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight
from tests.h2client import RawClient
from tests.process import RouterProcess

#: The file nghttpd serves: its GET answer carries it and its ``content-length``, its HEAD answer the
#: same ``content-length`` and no content.
PAGE = b"<!DOCTYPE html>\n<title>no content</title>\n<p>\n"
#: How soon the end of a HEAD answer must reach the client. Measured on loopback: 1-3 ms. (The router
#: used to hold the ``content-length`` against the missing content and reset the stream instead.)
PROMPT_SECS = 0.5
BARRIER = b"barrier!"


def _request(method: str, path: str) -> list[tuple[str, str]]:
    """An h2c request that is not a gRPC call, as a browser or curl asks it."""
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", "router")]


def _ended(client: RawClient, sid: int) -> list[Any]:
    """The frame that ended stream ``sid`` for the client: END_STREAM, or an RST_STREAM."""
    return [
        s.frame
        for s in client.frames
        if s.frame.stream_id == sid
        and (isinstance(s.frame, hf.RstStreamFrame) or "END_STREAM" in getattr(s.frame, "flags", ()))
    ]


async def _exchange(router: RouterProcess, method: str, path: str) -> tuple[RawClient, float]:
    """Send one request on stream 1 of a new connection to ``router``'s gRPC port and wait for the
    stream's end; then a PING whose ACK comes after whatever the router sent on the stream before it
    (so a reset following the end would be seen). Returns the client and how long the end took."""
    assert router.grpc_port is not None
    client = await RawClient.connect(router.grpc_port)
    started = time.monotonic()
    client.headers(1, _request(method, path), end_stream=True)
    await client.wait_for(lambda c: _ended(c, 1), what="the end of stream 1")
    took = time.monotonic() - started
    client.send(hf.PingFrame(0, opaque_data=BARRIER))
    await client.wait_for(
        lambda c: [f for f in c.of(hf.PingFrame) if "ACK" in f.flags and f.opaque_data == BARRIER],
        what="the PING's ACK",
    )
    client.decode_all()
    return client, took


def _head(client: RawClient) -> dict[bytes, bytes]:
    blocks = client.response_headers(1)
    assert blocks, client.summary()
    return dict(blocks[0])


async def _outcomes(router: RouterProcess) -> dict[tuple[str, str], float]:
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    return await grpc_requests(router)


@pytest.fixture
async def reference_server(tmp_path: Path) -> Any:
    """nghttpd serving ``/page.html`` (:data:`PAGE`); skipped without it (CI installs it)."""
    if not nghttpd.available():
        pytest.skip("nghttpd is not on PATH (Debian package nghttp2-server)")
    (tmp_path / "page.html").write_bytes(PAGE)
    async with nghttpd.serving(tmp_path) as port:
        yield port


@pytest.mark.parametrize("method", ["HEAD", "GET"])
async def test_a_real_servers_answer_with_a_content_length_ends_as_it_ends(
    grpc_router: StartGrpcRouter, reference_server: int, method: str
) -> None:
    """nghttpd answers HEAD with the file's ``content-length`` on HEADERS carrying END_STREAM: the
    client gets that head with END_STREAM at once, no reset after it, and the call is ``completed``
    (GET: the same head, then the file)."""
    router = await grpc_router("--access-log", grpc_upstream=f"http://127.0.0.1:{reference_server}")
    client, took = await _exchange(router, method, "/page.html")
    client.close()
    assert client.of(hf.RstStreamFrame, 1) == [], client.summary()
    head = _head(client)
    assert (head[b":status"], head[b"content-length"]) == (b"200", str(len(PAGE)).encode())
    if method == "HEAD":
        [headers] = client.of(hf.HeadersFrame, 1)
        assert "END_STREAM" in headers.flags and client.of(hf.DataFrame, 1) == [], client.summary()
        assert took < PROMPT_SECS, f"the end of a HEAD answer took {took:.3f} s"
    else:
        assert client.received_data(1) == PAGE
    assert await _outcomes(router) == {("none", "completed"): 1.0}
    event = await router.wait_event("grpc.call")
    assert (event["method"], event["outcome"]) == ("/page.html", "completed")
    assert "grpc.upstream_invalid" not in router.names()


def _answer(status: str, length: int | None, *, data: bytes | None = None) -> rawh2upstream.Answer:
    """A stand-in's answer: a head with ``status`` (and ``content-length: length``) that ends the
    stream, or (``data`` given) a head, then one DATA frame with ``data`` that ends it."""

    def answer(stream_id: int, encoder: Any) -> list[Any]:
        fields = [(":status", status)] + ([] if length is None else [("content-length", str(length))])
        block = encoder.encode(fields)
        if data is None:
            return [hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS", "END_STREAM"])]
        return [
            hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]),
            hf.DataFrame(stream_id, data=data, flags=["END_STREAM"]),
        ]

    return answer


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        pytest.param("GET", _answer("204", 12), id="204-with-content-length"),
        pytest.param("GET", _answer("304", 12), id="304-with-content-length"),
        pytest.param("HEAD", _answer("200", 12, data=b""), id="head-ended-by-an-empty-data"),
        pytest.param("GET", _answer("200", 5, data=b"hello"), id="get-with-its-whole-content"),
    ],
)
async def test_a_response_without_content_is_completed_whatever_its_content_length(
    grpc_router: StartGrpcRouter, method: str, answer: rawh2upstream.Answer
) -> None:
    """A stand-in's 204 or 304 carrying ``content-length: 12`` and END_STREAM on its HEADERS, or a
    HEAD answer ended by an empty DATA: relayed to its end, no reset, ``completed``."""
    async with rawh2upstream.serving(answer) as port:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{port}")
        client, took = await _exchange(router, method, "/x")
        client.close()
    assert client.of(hf.RstStreamFrame, 1) == [], client.summary()
    assert took < PROMPT_SECS, f"the end took {took:.3f} s"
    assert _head(client)[b"content-length"] in (b"12", b"5")
    assert await _outcomes(router) == {("none", "completed"): 1.0}


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        pytest.param("GET", _answer("200", 12, data=b"short"), id="get-short-of-its-content-length"),
        pytest.param("GET", _answer("200", 12), id="get-ended-by-its-head"),
        pytest.param("GET", _answer("200", 2, data=b"longer"), id="get-past-its-content-length"),
        pytest.param("HEAD", _answer("200", 5, data=b"hello"), id="head-answered-with-content"),
        pytest.param("GET", _answer("204", None, data=b"x"), id="204-with-content"),
    ],
)
async def test_content_that_disagrees_is_still_an_upstream_error(
    grpc_router: StartGrpcRouter, method: str, answer: rawh2upstream.Answer
) -> None:
    """Content that disagrees with the ``content-length`` of a response that has content, or any
    content on one that has none: the model server's stream is malformed, its content never reaches
    the client, which gets RST_STREAM CANCEL (not a gRPC call); ``upstream_error``."""
    async with rawh2upstream.serving(answer) as port:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{port}")
        client, _ = await _exchange(router, method, "/x")
        client.close()
    [reset] = client.of(hf.RstStreamFrame, 1)
    assert reset.error_code == 0x8, client.summary()
    assert client.received_data(1) == b""
    assert await _outcomes(router) == {("none", "upstream_error"): 1.0}
    assert (await router.wait_event("grpc.upstream_invalid"))["error"] == "malformed"
