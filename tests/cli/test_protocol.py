"""The traffic path at the protocol level, black-box: a real ``drain-router serve`` process, raw client
sockets, and a raw model server (:mod:`tests.rawupstream`) whose framing and connection handling the
test controls.

What an HTTP/1.1 proxy must get right on the wire, whatever it is built on: pipelined requests
(probes among them) answered in order; HEAD and no-body statuses without desynchronising a pooled
upstream connection; every framing of the upstream's response (Content-Length, chunked with
extensions and trailers, close-delimited, 1xx) delivered as the right bytes in the framing the client
can read (an HTTP/1.0 client gets no chunks); a pooled connection the model server closed retried
once for idempotent requests only; header-read and keep-alive idle timeouts; back-pressure both ways
with bounded memory; a client that leaves noticed while the model server is silent; and in-flight back
to 0 after each.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator

import pytest

from drain_router_dev.process import wait_until
from tests import rawupstream
from tests.blackbox import (
    by_outcome,
    closed_within,
    inflight,
    raw_exchange,
    read_response,
    requests_total,
    reset,
    settled,
    settled_rss,
    status_of,
    wait_idle,
)
from tests.process import RouterProcess, Start, router_starter


@pytest.fixture
async def raw() -> AsyncIterator[rawupstream.RawUpstream]:
    async with rawupstream.running() as upstream:
        yield upstream


@pytest.fixture
async def start_process(raw) -> AsyncIterator[Start]:
    """Factory for a router process in front of the raw upstream (or ``upstream=``)."""
    async with router_starter(raw.url) as start:
        yield start


async def _connect(p: RouterProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert p.port is not None
    return await asyncio.open_connection("127.0.0.1", p.port)


def _get(target: str, *, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: model\r\n{extra}\r\n".encode()


def _echoed(body: bytes) -> dict[str, object]:
    return json.loads(body)


# -- pipelining ------------------------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order_and_complete(start_process, raw):
    """Three requests in one send (a POST with a body among them, so the body's end must be found
    exactly): three whole responses, in order, on the same connection, which stays usable."""
    p = await start_process()
    reader, writer = await _connect(p)
    writer.write(
        _get("/cl?size=100000")
        + b"POST /echo?n=2 HTTP/1.1\r\nHost: model\r\nContent-Length: 11\r\n\r\nhello world"
        + _get("/chunked")
    )
    first = await read_response(reader)
    second = await read_response(reader)
    third = await read_response(reader)
    assert first.status == 200 and first.body == rawupstream.pattern(100000)
    assert second.status == 200
    echoed = _echoed(second.body)
    assert echoed["target"] == "/echo?n=2" and echoed["size"] == 11
    assert echoed["sha256"] == hashlib.sha256(b"hello world").hexdigest()
    assert third.status == 200 and third.body == rawupstream.CHUNKED_BODY
    writer.write(_get("/cl?size=10"))
    assert (await read_response(reader)).body == rawupstream.pattern(10)
    writer.close()
    assert raw.paths() == ["/cl", "/echo", "/chunked", "/cl"]
    await wait_idle(p.admin_port)


async def test_a_pipelined_probe_is_answered_in_its_place(start_process, raw):
    """A proxied request, ``GET /readyz`` and ``GET /livez`` pipelined behind it, then another proxied
    one, in one send: four responses in request order; the probes never reach the model server and
    never count as in flight; in-flight returns to 0."""
    p = await start_process()
    reader, writer = await _connect(p)
    writer.write(_get("/cl?size=70000") + _get("/readyz") + _get("/livez") + _get("/chunked"))
    proxied = await read_response(reader)
    ready = await read_response(reader)
    alive = await read_response(reader)
    last = await read_response(reader)
    writer.close()
    assert proxied.status == 200 and proxied.body == rawupstream.pattern(70000)
    assert ready.status == 200 and json.loads(ready.body)["status"] == "ready"
    assert alive.status == 200 and json.loads(alive.body) == {"status": "alive"}
    assert last.status == 200 and last.body == rawupstream.CHUNKED_BODY
    assert raw.paths() == ["/cl", "/chunked"]
    await wait_idle(p.admin_port)
    assert by_outcome(await requests_total(p.admin_port)) == {"completed": 2}


# -- HEAD and pool reuse ---------------------------------------------------------------------------


async def test_head_keeps_the_pooled_upstream_connection_in_sync(start_process, raw):
    """HEAD answered with a Content-Length (or chunked) and no body, then GETs, on one client
    connection: the client gets the head with its Content-Length and no body; the next request reuses
    the same upstream connection (one accepted in all) and reads its own answer, not a body the proxy
    wrongly waited for."""
    p = await start_process()
    reader, writer = await _connect(p)
    writer.write(_get("/cl?size=5000", method="HEAD"))
    head = await read_response(reader, method="HEAD")
    assert head.status == 200 and head.header(b"content-length") == b"5000"
    writer.write(_get("/echo?after=head"))
    after = await read_response(reader)
    assert after.status == 200 and _echoed(after.body)["target"] == "/echo?after=head"
    writer.write(_get("/chunked", method="HEAD"))
    head = await read_response(reader, method="HEAD")
    assert head.status == 200 and head.body == b""
    writer.write(_get("/cl?size=300"))
    after = await read_response(reader)
    assert after.body == rawupstream.pattern(300)
    with pytest.raises(TimeoutError):  # nothing stray (a body the router took for the next answer) follows
        await asyncio.wait_for(reader.read(1), 0.2)
    writer.close()
    assert [(s.method, s.path, s.conn) for s in raw.seen] == [
        ("HEAD", "/cl", 1),
        ("GET", "/echo", 1),
        ("HEAD", "/chunked", 1),
        ("GET", "/cl", 1),
    ]
    assert raw.accepted == 1
    await wait_idle(p.admin_port)


# -- HTTP/1.0 clients and Host ---------------------------------------------------------------------


async def test_http10_client_gets_a_chunked_upstream_body_without_chunk_framing(start_process, raw):
    """An HTTP/1.0 client (no Host, as 1.0 allows) and a chunked upstream answer: the client cannot
    read chunks, so it gets the exact bytes, delimited by a Content-Length or by the close."""
    p = await start_process()
    reader, writer = await _connect(p)
    writer.write(b"GET /chunked HTTP/1.0\r\n\r\n")
    response = await read_response(reader)
    assert response.status == 200
    assert response.header(b"transfer-encoding") is None, response.headers
    assert response.framing in ("length", "close")
    assert response.body == rawupstream.CHUNKED_BODY
    assert await closed_within(reader, 2.0), "an HTTP/1.0 connection without keep-alive is closed"
    writer.close()
    await wait_idle(p.admin_port)


async def test_http10_client_gets_no_interim_response(start_process, raw):
    """RFC 9110 §15.2: a server must not send a 1xx to an HTTP/1.0 client; the model server sends one
    anyway (``/continue``), the client sees only the final answer."""
    p = await start_process()
    answer, _ = await raw_exchange(
        p.port, b"POST /continue HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", timeout=3.0, whole=True
    )
    assert answer.startswith(b"HTTP/1.") and status_of(answer) == 200, answer[:200]
    assert b" 100 " not in answer.split(b"\r\n", 1)[0]
    assert _echoed(answer.split(b"\r\n\r\n", 1)[1])["size"] == 3
    await wait_idle(p.admin_port)


async def test_a_request_without_host(start_process, raw):
    """HTTP/1.0 does not require Host: such a request is proxied (to the configured upstream, the only
    place the router connects to), with no ``X-Forwarded-Host`` since the router saw none. HTTP/1.1
    requires it (RFC 9112 §3.2: a server must answer 400): 400 JSON, counted ``rejected``, not
    proxied, and the connection closed."""
    p = await start_process()
    answer, _ = await raw_exchange(p.port, b"GET /echo?v=0 HTTP/1.0\r\n\r\n", whole=True)
    assert status_of(answer) == 200, answer[:200]
    assert raw.paths() == ["/echo"]
    assert "x-forwarded-host" not in raw.seen[0].headers, "no Host seen, none vouched for"
    answer, closed = await raw_exchange(p.port, b"GET /echo?v=1 HTTP/1.1\r\nX-Other: y\r\n\r\n")
    assert status_of(answer) == 400, answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["type"] == "bad_request"
    assert closed
    assert raw.paths() == ["/echo"], "the 1.1 request without Host was not proxied"
    await wait_idle(p.admin_port)
    assert by_outcome(await requests_total(p.admin_port)) == {"completed": 1, "rejected": 1}


# -- strict framing (request smuggling) -----------------------------------------------------------

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
AMBIGUOUS = {
    # RFC 9112 §6.1-6.3: each of these has no single reading; a proxy that picks one while the model
    # server picks another forwards the embedded request as a second one (request smuggling).
    "te-and-cl": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
    b"0\r\n\r\n" + SMUGGLED,
    "cl-and-te": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 43\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\n" + SMUGGLED,
    "two-lengths": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 38\r\n\r\n" + SMUGGLED,
    "length-list": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 38\r\n\r\n" + SMUGGLED,
    "signed-length": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: +38\r\n\r\n" + SMUGGLED,
    "space-before-colon": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "chunked-not-last": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
    b"0\r\n\r\n" + SMUGGLED,
    "te-obfuscated": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "chunk-size-overflow": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"10000000000000026\r\n" + SMUGGLED + b"\r\n0\r\n\r\n",
    "bare-lf-chunks": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\nhi\n0\n\n" + SMUGGLED,
    "nul-in-header": b"POST /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n" + SMUGGLED,
}


async def test_ambiguous_framing_is_refused_and_nothing_is_smuggled(start_process, raw):
    """Each request whose framing has more than one reading, with a request hidden where one reading
    puts the body: 400 (or 501 for a coding it does not know), one answer, the connection closed,
    nothing proxied (the hidden request least of all), counted ``rejected``. One router for all of
    them; every case that fails is named."""
    p = await start_process()
    failures = {}
    for name, request_bytes in AMBIGUOUS.items():
        seen = len(raw.seen)
        answer, closed = await raw_exchange(p.port, request_bytes)
        answers = len(re.findall(rb"HTTP/1\.[01] \d{3} ", answer))
        if status_of(answer) not in (400, 501) or answers != 1 or not closed or len(raw.seen) != seen:
            failures[name] = (answer[:120], f"answers={answers} closed={closed} upstream saw {raw.paths()}")
    assert not failures, failures
    assert raw.accepted == 0
    assert by_outcome(await requests_total(p.admin_port)) == {"rejected": len(AMBIGUOUS)}


# -- oversized heads and timeouts ------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-" + b"n" * 9000 + b": v\r\n\r\n",
    ],
    ids=["request-line", "header-value", "header-name"],
)
async def test_an_oversized_head_is_431_json_and_closed(start_process, raw, request_bytes):
    """A request line or header past 8190 bytes: 431 with the JSON error body, the connection closed,
    counted ``rejected``; nothing reaches the model server."""
    p = await start_process()
    answer, closed = await raw_exchange(p.port, request_bytes)
    assert status_of(answer) == 431, answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body) == {
        "error": {"type": "request_header_too_large", "message": json.loads(body)["error"]["message"], "code": 431}
    }
    assert closed
    assert raw.accepted == 0
    assert by_outcome(await requests_total(p.admin_port)) == {"rejected": 1}


async def test_too_many_headers_are_431_json_and_closed(start_process, raw):
    """More than 128 header fields: 431 with the JSON error body (docs/proxying.md, limits), the connection
    closed, counted ``rejected``, nothing proxied."""
    p = await start_process()
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    answer, closed = await raw_exchange(p.port, b"GET /echo HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert raw.accepted == 0
    assert closed
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == status_of(answer)
    assert by_outcome(await requests_total(p.admin_port)) == {"rejected": 1}
    assert status_of(answer) == 431, answer[:200]


async def test_header_timeout_applies_to_each_head_never_to_a_body(start_process, raw):
    """Header timeout 1 s: on a reused keep-alive connection, a second head that stops half-way is
    closed 1 s after its first byte (not after the keep-alive timeout, 30 s); a request whose head
    is whole but whose body takes longer than the header timeout is served."""
    p = await start_process("--client-header-timeout-secs", "1", "--client-keepalive-timeout-secs", "30")
    reader, writer = await _connect(p)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    await writer.drain()
    assert await closed_within(reader, 1.6) is False, "a slow body is not a slow head"
    writer.write(b"67890")
    answer = await read_response(reader)
    assert answer.status == 200 and _echoed(answer.body)["size"] == 10
    writer.write(b"GET /echo HTTP/1.1\r\nHo")
    await writer.drain()
    started = time.monotonic()
    assert await closed_within(reader, 4.0), "a head that stops half-way is closed"
    took = time.monotonic() - started
    assert 0.8 <= took < 2.5, took
    writer.close()
    assert raw.paths() == ["/echo"]
    await wait_idle(p.admin_port)


async def test_keepalive_idle_timeout_closes_idle_connections_only(start_process, raw):
    """Keep-alive timeout 1 s: requests every 0.6 s keep one connection open past 1 s (each request
    restarts the clock); after the last one, the idle connection is closed about 1 s later."""
    p = await start_process("--client-keepalive-timeout-secs", "1", "--client-header-timeout-secs", "10")
    reader, writer = await _connect(p)
    for i in range(4):
        writer.write(_get(f"/cl?size={i + 1}"))
        assert (await read_response(reader)).body == rawupstream.pattern(i + 1)
        if i < 3:
            assert await closed_within(reader, 0.6) is False, f"closed while in use (after request {i + 1})"
    idle_from = time.monotonic()
    assert await closed_within(reader, 4.0), "an idle keep-alive connection is closed"
    assert 0.8 <= time.monotonic() - idle_from < 2.5
    writer.close()
    await wait_idle(p.admin_port)


# -- every framing of the upstream's response ------------------------------------------------------

FRAMINGS = [
    # (target, body the client must get, whether the upstream connection can be reused)
    ("/cl?size=1000", rawupstream.pattern(1000), True),
    ("/cl?size=300000", rawupstream.pattern(300000), True),
    ("/chunked", rawupstream.CHUNKED_BODY, True),
    ("/close?size=1000", rawupstream.pattern(1000), False),
    ("/close?size=300000", rawupstream.pattern(300000), False),
    ("/status/204", b"", True),
    ("/status/304", b"", True),
]


@pytest.mark.parametrize(("target", "body", "reusable"), FRAMINGS, ids=[f[0].strip("/") for f in FRAMINGS])
async def test_every_upstream_framing_reaches_the_client_intact(start_process, raw, target, body, reusable):
    """One framing of the upstream's answer, twice on one client connection, then another request:
    the client gets exactly the body (no chunk extension, size line or trailer inside it), in a
    framing an HTTP/1.1 client can delimit; the client connection stays usable; the upstream
    connection is reused when its framing allows it and replaced when the body ended with its close."""
    p = await start_process()
    reader, writer = await _connect(p)
    for _ in range(2):
        writer.write(_get(target))
        response = await read_response(reader)
        assert response.body == body, (response.framing, len(response.body), len(body))
        if not body:
            assert response.framing == "none" and response.header(b"transfer-encoding") is None
        assert not response.closes(), "the client connection can be reused"
    writer.write(_get("/echo?after=1"))
    after = await read_response(reader)
    assert after.status == 200 and _echoed(after.body)["target"] == "/echo?after=1"
    writer.close()
    assert raw.accepted == (1 if reusable else 3), [(s.path, s.conn) for s in raw.seen]
    assert all(s.answered for s in raw.seen)
    await wait_idle(p.admin_port)
    assert by_outcome(await requests_total(p.admin_port)) == {"completed": 3}


async def test_expect_100_continue_gets_one_interim_answer_before_the_body(start_process, raw):
    """A client that sends ``Expect: 100-continue`` and waits: it gets ``100 Continue`` before sending
    its body, then one final answer (the model server's own 100 does not become a second final
    response); the connection is reused afterwards."""
    p = await start_process()
    reader, writer = await _connect(p)
    payload = b"x" * 5000
    writer.write(
        b"POST /continue HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(payload)
    )
    interim = await read_response(reader, timeout=3.0)
    assert interim.status == 100, "the client waits for 100 Continue before it sends the body"
    writer.write(payload)
    final = await read_response(reader)
    while final.status == 100:  # a second interim answer is allowed; never a second final one
        final = await read_response(reader)
    assert final.status == 200
    assert _echoed(final.body)["sha256"] == hashlib.sha256(payload).hexdigest()
    writer.write(_get("/cl?size=7"))
    assert (await read_response(reader)).body == rawupstream.pattern(7)
    writer.close()
    await wait_idle(p.admin_port)


# -- stale pooled connections ----------------------------------------------------------------------


async def test_a_pooled_connection_closed_while_idle_is_not_used(start_process, raw):
    """The model server closes an idle keep-alive connection (no ``Connection: close`` announced
    it); 0.3 s later a GET and a POST arrive: both are served on new connections, none fails."""
    p = await start_process()
    answer, _ = await raw_exchange(p.port, _get("/idle-close"), whole=True)
    assert status_of(answer) == 200
    await asyncio.sleep(0.3)  # the scenario: the close happened well before the next request
    answer, _ = await raw_exchange(p.port, _get("/echo?m=get"), whole=True)
    assert status_of(answer) == 200, answer[:200]
    answer, _ = await raw_exchange(
        p.port, b"POST /echo?m=post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", whole=True
    )
    assert status_of(answer) == 200, answer[:200]
    assert [s.path for s in raw.seen] == ["/idle-close", "/echo", "/echo"]
    assert all(s.answered for s in raw.seen)
    await wait_idle(p.admin_port)


async def test_a_stale_pooled_connection_is_retried_once_for_a_get(start_process, raw):
    """The pooled connection dies as it is reused (the model server closes it on the next request,
    unanswered): a GET is sent again once, on a new connection, and succeeds."""
    p = await start_process()
    answer, _ = await raw_exchange(p.port, _get("/stale"), whole=True)
    assert status_of(answer) == 200
    answer, _ = await raw_exchange(p.port, _get("/echo?try=1"), whole=True)
    assert status_of(answer) == 200, answer[:200]
    assert [(s.path, s.conn, s.answered) for s in raw.seen] == [
        ("/stale", 1, True),
        ("/echo", 1, False),
        ("/echo", 2, True),
    ]
    await wait_idle(p.admin_port)
    assert by_outcome(await requests_total(p.admin_port)) == {"completed": 2}


async def test_a_stale_pooled_connection_is_not_retried_for_a_post(start_process, raw):
    """The same race for a POST: it is not idempotent, so it is not sent again (the model server may
    have acted on it): 502, and the model server saw it exactly once, on the stale connection."""
    p = await start_process()
    answer, _ = await raw_exchange(p.port, _get("/stale"), whole=True)
    assert status_of(answer) == 200
    answer, _ = await raw_exchange(
        p.port, b"POST /echo?try=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", whole=True
    )
    assert status_of(answer) == 502, answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == 502
    assert [(s.method, s.path, s.conn, s.answered) for s in raw.seen] == [
        ("GET", "/stale", 1, True),
        ("POST", "/echo", 1, False),
    ]
    assert raw.accepted == 1, "no second connection was opened to send it again"
    await wait_idle(p.admin_port)
    assert by_outcome(await requests_total(p.admin_port)) == {"completed": 1, "upstream_error": 1}


# -- back-pressure and memory ----------------------------------------------------------------------


UPLOAD_BYTES = 64 * 1024 * 1024


async def test_an_upload_to_a_stalled_model_server_is_held_back(start_process, raw):
    """A client uploads 64 MiB to a model server that reads nothing of it: the router holds the client
    back instead of buffering, so its RSS grows by less than 8 MiB while stalled, and far less than
    the body has been accepted from the client; once the model server reads, the whole body arrives
    intact."""
    p = await start_process("--max-request-body-bytes", str(2 * UPLOAD_BYTES))
    answer, _ = await raw_exchange(p.port, _get("/cl?size=100000"), whole=True)  # warm up the path
    assert status_of(answer) == 200
    before = await settled_rss(p.proc.pid, settle=0.5)
    reader, writer = await _connect(p)
    writer.transport.set_write_buffer_limits(high=256 * 1024)
    writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % UPLOAD_BYTES)
    piece = rawupstream.pattern(256 * 1024)
    sent = 0

    async def upload() -> None:
        nonlocal sent
        while sent < UPLOAD_BYTES:
            writer.write(piece)
            await writer.drain()
            sent += len(piece)

    uploading = asyncio.ensure_future(upload())
    await asyncio.wait_for(raw.upload_started.wait(), 5)
    # Wait until the client can send no more: everything between it and the model server is full.
    await settled(lambda: sent, settle=1.0, timeout=20, what="the bytes the upload sent")
    grew = await settled_rss(p.proc.pid) - before
    assert not uploading.done(), "the upload was accepted whole while the model server read nothing"
    assert sent < UPLOAD_BYTES // 2, f"{sent} bytes accepted from the client while stalled"
    assert grew < 8 * 1024 * 1024, f"router RSS grew {grew / 2**20:.1f} MiB holding a stalled upload"
    raw.resume_upload.set()
    await asyncio.wait_for(uploading, 30)
    answer = await read_response(reader, timeout=30)
    writer.close()
    echoed = _echoed(answer.body)
    assert echoed["size"] == UPLOAD_BYTES
    assert echoed["sha256"] == hashlib.sha256(rawupstream.pattern(256 * 1024) * 256).hexdigest()
    await wait_idle(p.admin_port)


STALLED_STREAMS = 20


@pytest.mark.parametrize("target", ["/cl?size=67108864", "/close?size=67108864"], ids=["content-length", "close"])
async def test_clients_that_stop_reading_a_64mib_body_cost_bounded_memory(start_process, raw, target):
    """20 clients each ask for a 64 MiB body (Content-Length, or ended by the upstream's close) and
    stop reading after the head: the router holds each upstream back instead of buffering, so its RSS
    grows by less than 256 KiB per stalled stream (the chunked case is
    ``test_hardening.test_a_stalled_reader_costs_bounded_memory``); when they leave, every upstream
    connection is closed and in-flight returns to 0."""
    p = await start_process()
    answer, _ = await raw_exchange(p.port, _get("/cl?size=100000"), whole=True)  # warm up the path
    assert status_of(answer) == 200
    before = await settled_rss(p.proc.pid, settle=0.5)
    held = []
    for _ in range(STALLED_STREAMS):
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port, limit=1024)
        writer.transport.set_write_buffer_limits(0)
        writer.write(_get(target))
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.pause_reading()
        held.append(writer)
    await wait_until(lambda: len(raw.seen) == STALLED_STREAMS + 1, 10, "every stream reached the upstream")
    per_stream = (await settled_rss(p.proc.pid) - before) / STALLED_STREAMS
    assert per_stream < 256 * 1024, f"{per_stream / 1024:.0f} KiB per stalled stream"
    assert not any(s.answered for s in raw.seen[1:]), "the bodies were held back, not buffered whole"
    assert (await inflight(p.admin_port))["inflight"] == STALLED_STREAMS
    for writer in held:
        writer.transport.abort()
    await wait_idle(p.admin_port, timeout=10)
    outcomes = by_outcome(await requests_total(p.admin_port))
    assert outcomes == {"completed": 1, "client_aborted": STALLED_STREAMS}, outcomes


# -- a client that leaves, and the drain -----------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_that_leaves_while_the_model_server_is_silent_closes_the_upstream(start_process, raw, how):
    """The model server has said nothing yet (a long prefill); the client closes (or resets) its
    connection: the router closes the upstream connection within 1 s, without waiting for a byte to
    write, and counts ``client_aborted``."""
    p = await start_process()
    _reader, writer = await _connect(p)
    writer.write(_get("/silent"))
    await asyncio.wait_for(raw.silent_started.wait(), 5)
    assert (await inflight(p.admin_port))["inflight"] == 1
    left = time.monotonic()
    if how == "reset":
        reset(writer)
    else:
        writer.close()
    await asyncio.wait_for(raw.peer_closed_event.wait(), 1.0)
    assert time.monotonic() - left < 1.0
    await wait_idle(p.admin_port, timeout=1.0)
    assert by_outcome(await requests_total(p.admin_port)) == {"client_aborted": 1}


async def test_draining_answers_carry_connection_close_and_end_the_connection(start_process, raw):
    """A keep-alive connection opened before SIGTERM: while draining, its next response (a proxied
    one, and a probe on another connection) says ``Connection: close`` and the router closes the
    connection after it, so a pooled client reconnects elsewhere; a pipelined request behind it is
    not answered on this connection."""
    p = await start_process(drain_secs="30")
    reader, writer = await _connect(p)
    writer.write(_get("/cl?size=10"))
    before = await read_response(reader)
    assert before.status == 200 and not before.closes()
    p.signal()
    await p.wait_event("drain.start")
    writer.write(_get("/chunked") + _get("/cl?size=5"))
    during = await read_response(reader)
    assert during.status == 200 and during.body == rawupstream.CHUNKED_BODY
    assert during.header(b"connection") == b"close", during.headers
    assert await closed_within(reader, 2.0), "the connection ends after a draining response"
    writer.close()
    answer, _ = await raw_exchange(p.port, _get("/readyz"), whole=True)
    assert status_of(answer) == 503 and b"\r\nConnection: close\r\n" in answer, answer[:300]
    assert raw.paths() == ["/cl", "/chunked"]
    await wait_idle(p.admin_port)
