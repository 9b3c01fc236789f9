"""One named test per defect of the attack report, each a plain exchange against a real router
process, answers read by h11 (numbers are the report's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from drain_router_dev.process import wait_until
from tests.blackbox import by_outcome, wait_idle
from tests.conformance import wire
from tests.conformance.test_memory import flood
from tests.process import RouterProcess, Start, router_starter


@pytest.fixture
async def up() -> AsyncIterator[wire.Upstream]:
    async with wire.upstream() as upstream:
        yield upstream


@pytest.fixture
async def start(up) -> AsyncIterator[Start]:
    async with router_starter(up.url) as starter:
        yield starter


_OPEN: list[wire.Client] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Every client a test opened is closed after it, whether or not it got that far."""
    yield
    while _OPEN:
        transport = _OPEN.pop().writer.transport
        if not transport.is_closing():  # a closed one has let go of its loop: aborting it would fail
            transport.abort()
        await asyncio.sleep(0)  # let the transport's close callback run before the loop ends


def _get(rid: str, *, method: str = "GET", version: str = "1.1", extra: bytes = b"") -> bytes:
    return b"%s /r/%s HTTP/%s\r\nHost: model\r\nX-Req-Id: %s\r\n%s\r\n" % (
        method.encode(),
        rid.encode(),
        version.encode(),
        rid.encode(),
        extra,
    )


async def _counted(p: RouterProcess) -> dict[tuple[str, str], float]:
    assert p.admin_port is not None
    return await wire.counted(p.admin_port)


async def _idle(p: RouterProcess, timeout: float = 5.0) -> None:
    assert p.admin_port is not None
    await wait_idle(p.admin_port, timeout)


async def _open(p: RouterProcess) -> wire.Client:
    assert p.port is not None
    client = await wire.Client.open(p.port)
    _OPEN.append(client)
    return client


async def _sentinel(client: wire.Client, up: wire.Upstream) -> wire.Seen:
    """One more request on ``client``'s connection gets its own answer; returns it as the upstream saw it."""
    sid = wire.new_id("s")
    await client.send(_get(sid))
    answer = await client.response("GET")
    assert answer is not None, "the next request on the connection got no answer"
    assert answer.echo_id == sid, f"the next request got a response meant for {answer.echo_id!r}: {answer.body[:80]!r}"
    (seen,) = up.by_id(sid)
    return seen


# -- 1. smuggling through Connection: content-length ----------------------------------------------

SMUGGLING = {
    "connection-content-length": b"POST /r/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\nContent-Length: 5\r\n"
    b"Connection: content-length\r\n\r\nhello",
    "connection-content-length-keep-alive": b"POST /r/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\n"
    b"Content-Length: 5\r\nConnection: Content-Length, keep-alive\r\n\r\nhello",
    "connection-transfer-encoding-chunked": b"POST /r/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: transfer-encoding\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("shape", sorted(SMUGGLING))
async def test_01_a_request_nominating_a_framing_header_is_400_and_forwards_nothing(start, up, shape):
    p = await start()
    rid = wire.new_id()
    client = await _open(p)
    await client.send(SMUGGLING[shape] % (rid.encode(), rid.encode()))
    answer = await client.response("POST")
    assert answer is not None and answer.status == 400, f"got {answer and answer.status} {answer and answer.body!r}"
    assert not await client.rest(), "bytes after the 400"
    client.close()
    await _idle(p)
    assert up.seen == [], f"the upstream got {[(s.method, s.target) for s in up.seen]}"


async def test_01_an_upstream_response_nominating_content_length_is_a_502(start, up):
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello"])
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET")
    client.close()
    assert answer is not None and answer.status == 502, f"got {answer and answer.status} {answer and answer.body!r}"
    await _idle(p)


async def test_01_a_smuggled_request_never_reaches_the_upstream_nor_another_client(start, up):
    """The attack as reported: a POST whose Content-Length the attacker nominates in Connection, its
    body a whole ``GET /secret``; then another client's request on a new connection."""
    p = await start()
    smuggled = b"GET /secret HTTP/1.1\r\nHost: model\r\nX-Req-Id: secret\r\n\r\n"
    attacker = await _open(p)
    await attacker.send(
        b"POST /r/attack HTTP/1.1\r\nHost: model\r\nX-Req-Id: attack\r\nContent-Length: %d\r\n"
        b"Connection: content-length\r\n\r\n%s" % (len(smuggled), smuggled)
    )
    first = await attacker.response("POST")
    attacker.close()
    await _idle(p)
    victim = await _open(p)
    vid = wire.new_id("victim")
    await victim.send(_get(vid))
    answer = await victim.response("GET")
    victim.close()
    await _idle(p)
    assert answer is not None and answer.echo_id == vid, f"the victim got {answer}"
    assert b"/secret" not in [s.target for s in up.seen], "the upstream served the smuggled /secret"
    assert first is not None and first.status == 400, f"the attacker got {first and first.status}"


# -- 2. pipelining: memory and in-flight -----------------------------------------------------------


async def test_02_pipelined_requests_behind_a_silent_one_cost_bounded_memory_and_inflight(start, up):
    p = await start("--client-header-timeout-secs", "30")
    await flood(p, up, connections=4, pipelined=5000)


# -- 4. surplus upstream bytes ---------------------------------------------------------------------

SURPLUS = {
    "content-length-then-a-second-response": (
        "GET",
        b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nContent-Length: 5\r\n\r\nhello"
        b"HTTP/1.1 200 OK\r\nX-Echo-Id: nobody\r\nContent-Length: 6\r\n\r\nnobody",
        200,
        b"hello",
    ),
    "204-then-200": (
        "GET",
        b"HTTP/1.1 204 No Content\r\nX-Echo-Id: %s\r\n\r\nHTTP/1.1 200 OK\r\nX-Echo-Id: nobody\r\nContent-Length: 6\r\n\r\nnobody",
        204,
        b"",
    ),
    "head-answer-with-the-body-it-announces": (
        "HEAD",
        b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nContent-Length: 5\r\n\r\nhello",
        200,
        b"",
    ),
    "head-answer-then-a-second-head": (
        "HEAD",
        b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\nX-Echo-Id: nobody\r\n"
        b"Content-Length: 6\r\n\r\n",
        200,
        b"",
    ),
}


@pytest.mark.parametrize("shape", sorted(SURPLUS))
async def test_04_surplus_after_the_framed_end_is_never_relayed(start, up, shape):
    method, script, status, body = SURPLUS[shape]
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([script % rid.encode()])
    client = await _open(p)
    await client.send(_get(rid, method=method))
    answer = await client.response(method)
    assert answer is not None, f"no response; reset={client.reset}"
    assert (answer.status, answer.echo_id, answer.body) == (status, rid, body)
    sentinel = await _sentinel(client, up)
    client.close()
    assert sentinel.conn != up.by_id(rid)[0].conn, "the upstream connection that sent surplus was reused"
    await _idle(p)


# -- 5. upstream response head bounds --------------------------------------------------------------

HUGE_HEADS = {
    "10-MB-header-value": [b"HTTP/1.1 200 OK\r\nX-Big: " + b"v" * (10 << 20) + b"\r\nContent-Length: 2\r\n\r\nhi"],
    "100000-headers": [b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 100_000 + b"Content-Length: 2\r\n\r\nhi"],
    # Small enough in bytes (5 KB) that only the header count can refuse it.
    "1000-tiny-headers": [b"HTTP/1.1 200 OK\r\n" + b"X:v\r\n" * 1000 + b"Content-Length: 2\r\n\r\nhi"],
}


@pytest.mark.parametrize("shape", sorted(HUGE_HEADS))
async def test_05_an_oversized_upstream_head_is_a_502(start, up, shape):
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script(HUGE_HEADS[shape], then="close")
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET", timeout=20)
    client.close()
    assert answer is not None and answer.status == 502, f"got {answer and answer.status}"
    await _idle(p)


async def test_05_an_upstream_head_that_never_ends_is_a_502(start, up):
    """The router bounds the upstream head's time to complete like a client's: the router's
    RESPONSE_HEAD_SECS (10 s from its first byte) gives a 502, well within 30 s."""
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([b"HTTP/1.1 200 OK\r\nX-Slow: 1\r\n"], then="hold")
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET", timeout=30)
    client.close()
    assert answer is not None and answer.status == 502, f"got {answer and answer.status}"
    await _idle(p)


# -- 6. a malformed pipelined request after valid ones --------------------------------------------


async def _answered_then_400(p: RouterProcess, stream: bytes, first: str, method: str, *, then_400: bool) -> None:
    before = await _counted(p)
    client = await _open(p)
    await client.send(stream)
    answer = await client.response(method)
    assert answer is not None, f"the valid request got no answer; reset={client.reset}"
    assert answer.status == 200 and answer.echo_id == first, f"the valid request got {answer.status}"
    if then_400:
        refusal = await client.response("GET")
        assert refusal is not None and refusal.status == 400, f"then {refusal and refusal.status}, not 400"
    extra = await client.rest()
    assert not extra, f"after the answers: {extra[:200]!r}"
    client.close()
    await _idle(p)
    counted = by_outcome(wire.delta(before, await _counted(p)))
    assert "client_aborted" not in counted, counted


async def test_06_a_valid_post_then_garbage_in_one_write_is_answered_then_400(start, up):
    p = await start()
    rid = wire.new_id()
    stream = b"POST /r/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\nContent-Length: 0\r\n\r\nGARBAGE\r\n\r\n" % (
        (rid.encode(),) * 2
    )
    await _answered_then_400(p, stream, rid, "POST", then_400=True)


async def test_06_a_request_with_connection_close_then_garbage_gets_only_its_answer(start, up):
    p = await start()
    rid = wire.new_id()
    await _answered_then_400(
        p, _get(rid, extra=b"Connection: close\r\n") + b"GARBAGE\r\n\r\n", rid, "GET", then_400=False
    )


async def test_06_an_http10_request_then_another_gets_only_its_answer(start, up):
    p = await start()
    rid, other = wire.new_id(), wire.new_id()
    await _answered_then_400(p, _get(rid, version="1.0") + _get(other), rid, "GET", then_400=False)
    assert up.by_id(other) == [], "the request after the HTTP/1.0 one was forwarded"


async def test_06_garbage_during_a_streaming_response_does_not_cut_it(start, up):
    p = await start()
    rid = wire.new_id()
    head_out, go_on = asyncio.Event(), asyncio.Event()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n" % rid.encode(),
            head_out.set,
            go_on,
            b"6\r\nsecond\r\n0\r\n\r\n",
        ]
    )
    before = await _counted(p)
    client = await _open(p)
    await client.send(_get(rid))
    await asyncio.wait_for(head_out.wait(), 5)
    await client.send(b"GARBAGE\r\n\r\n")
    await _round_trip(p)
    go_on.set()
    answer = await client.response("GET")
    assert answer is not None, f"the stream was cut; reset={client.reset}; bytes {bytes(client.raw)[:200]!r}"
    assert answer.status == 200 and answer.body == b"firstsecond"
    refusal = await client.response("GET")
    assert refusal is not None and refusal.status == 400, f"then {refusal and refusal.status}, not 400"
    assert not await client.rest()
    client.close()
    await _idle(p)
    counted = by_outcome(wire.delta(before, await _counted(p)))
    assert "client_aborted" not in counted, counted


async def _round_trip(p: RouterProcess) -> None:
    """Best effort, no sleep: one round trip through the router's loop (its admin port), so that it
    has most likely read the garbage before the stream goes on."""
    assert p.admin_port is not None
    await wire.counted(p.admin_port)


# -- 7, 8. bad statuses ------------------------------------------------------------------------------


async def test_07_upstream_status_000_is_a_502_without_a_hang(start, up):
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([b"HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nhi"])
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET", timeout=5)
    client.close()
    assert answer is not None and answer.status == 502, f"got {answer and answer.status}"
    await _idle(p)


UNREQUESTED_101 = {
    "upgrade-headers": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    "bare-then-200": b"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
}


@pytest.mark.parametrize("shape", sorted(UNREQUESTED_101))
async def test_08_an_unrequested_101_is_a_502_and_the_request_goes_up_once(start, up, shape):
    """The router forwarded no Upgrade request, so nobody asked to switch: a 502 (never a 101 relayed
    as if interim), and the request is not retried."""
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([UNREQUESTED_101[shape]], then="close")
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET", timeout=5)
    client.close()
    assert answer is not None and answer.status == 502, f"got {answer and answer.status}"
    assert 101 not in answer.interim, answer.interim
    await _idle(p)
    assert len(up.by_id(rid)) == 1, f"the request reached the upstream {len(up.by_id(rid))} times"


# -- 9. metrics record the status actually sent ------------------------------------------------------


async def test_09_a_204_with_a_body_is_a_204_and_is_counted_as_one(start, up):
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script([b"HTTP/1.1 204 No Content\r\nX-Echo-Id: %s\r\n\r\nsurplus body" % rid.encode()])
    before = await _counted(p)
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET")
    assert answer is not None, f"no response; reset={client.reset}"
    assert answer.status == 204 and answer.body == b""
    await _sentinel(client, up)
    client.close()
    await _idle(p)
    assert wire.delta(before, await _counted(p)) == {("204", "completed"): 1.0, ("200", "completed"): 1.0}


async def test_09_a_chunk_size_overflow_with_the_head_is_a_502_and_counted_as_one(start, up):
    """The head and a broken body in one upstream read: nothing went out yet, so the status can still
    change: the client gets a whole 502, and the count says 502 (not a 200 that was never sent)."""
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffffff\r\n"
            % rid.encode()
        ],
        then="hold",
    )
    before = await _counted(p)
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET")
    assert answer is not None and answer.status == 502, f"got {answer and answer.status}"
    client.close()
    await _idle(p)
    assert wire.delta(before, await _counted(p)) == {("502", "upstream_error"): 1.0}


async def test_09_a_chunk_size_overflow_after_the_head_cuts_the_client_and_counts_upstream_error(start, up):
    """The head went out (the client has read it) before the body turns out broken: the status can
    no longer change, so the client connection is cut and the count says upstream_error with the
    status the client did receive. (Broken in the same read as the head, it would be a whole 502:
    test_responses covers that.)"""
    p = await start()
    rid = wire.new_id()
    head_read = asyncio.Event()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n" % rid.encode(),
            head_read,
            b"fffffffffffffffffffffff\r\nx\r\n",
        ],
        then="hold",
    )
    before = await _counted(p)
    client = await _open(p)
    await client.send(_get(rid))
    while b"\r\n\r\n" not in client.raw:  # the router wrote the head: the client has it
        await client._fill(time.monotonic() + 5)
    head_read.set()
    try:
        answer = await client.response("GET")
    except wire.NotHttp:  # h11: the body ended before its framed end (a cut)
        answer = None
    assert answer is None, f"the client got a whole response ({answer.status}) from a broken upstream body"
    client.close()
    await _idle(p)
    counted = wire.delta(before, await _counted(p))
    assert counted == {("200", "upstream_error"): 1.0}, counted


# -- 12. 103 Early Hints -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_12_103_is_forwarded_to_http11_clients_only(start, up, version):
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nContent-Length: 2\r\n\r\nok" % rid.encode(),
        ]
    )
    client = await _open(p)
    await client.send(_get(rid, version=version))
    answer = await client.response("GET", close=version == "1.0")
    client.close()
    assert answer is not None and answer.status == 200 and answer.body == b"ok"
    assert answer.interim == ([103] if version == "1.1" else []), f"interim responses: {answer.interim}"
    if version == "1.1":
        assert (b"link", b"</a.css>; rel=preload") in answer.interim_headers[0]
    await _idle(p)


# -- 13. 431 and 413 are read, not reset -------------------------------------------------------------


async def test_13_a_200_kb_header_gets_a_readable_431(start, up):
    p = await start()
    client = await _open(p)
    await client.send(b"GET / HTTP/1.1\r\nHost: model\r\nX-Big: " + b"b" * 200_000 + b"\r\n\r\n")
    answer = await client.response("GET")
    assert answer is not None, f"no 431; reset={client.reset}; write error {client.write_error!r}"
    assert answer.status == 431
    client.close()
    assert up.seen == []


@pytest.mark.parametrize(("body_bytes", "limit"), [(2 << 20, 65536), (16 << 20, 1 << 20)])
async def test_13_a_body_over_the_limit_gets_a_readable_413(start, up, body_bytes, limit):
    p = await start("--max-request-body-bytes", str(limit))
    client = await _open(p)
    head = b"POST /upload HTTP/1.1\r\nHost: model\r\nContent-Length: %d\r\n\r\n" % body_bytes
    sending = asyncio.ensure_future(client.send(head, *[b"u" * 65536] * (body_bytes // 65536)))
    started = time.monotonic()
    try:
        answer = await client.response("POST", timeout=20)
    finally:
        sending.cancel()
    assert answer is not None, (
        f"no 413 after {time.monotonic() - started:.1f}s; reset={client.reset}; write error {client.write_error!r}"
    )
    assert answer.status == 413
    client.close()
    assert up.seen == []
    await _idle(p)


# -- rerun 1. an interim head carries no framing headers --------------------------------------------

INTERIM_FRAMING = {
    "content-length": b"Content-Length: 5\r\n",
    "transfer-encoding": b"Transfer-Encoding: chunked\r\n",
}


@pytest.mark.parametrize("header", sorted(INTERIM_FRAMING))
async def test_rerun_1_a_103_reaches_the_client_without_framing_headers(start, up, header):
    """No 1xx response has a body, so none carries Content-Length or Transfer-Encoding (RFC 9110
    §8.6, RFC 9112 §6.1): the router drops them from the 103 it relays, and keeps its other headers."""
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n" + INTERIM_FRAMING[header] + b"\r\n",
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nContent-Length: 2\r\n\r\nok" % rid.encode(),
        ]
    )
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET")
    client.close()
    assert answer is not None and (answer.status, answer.body) == (200, b"ok"), answer
    assert answer.interim == [103], f"interim responses: {answer.interim}"
    interim = bytes(client.raw).split(b"\r\n\r\n", 1)[0]
    assert interim.startswith(b"HTTP/1.1 103 "), interim
    lines = [line.lower() for line in interim.split(b"\r\n")]
    assert not [line for line in lines if line.startswith((b"content-length:", b"transfer-encoding:"))], interim
    assert b"link: </a.css>; rel=preload" in lines
    assert not wire.framing_faults(answer)
    await _idle(p)


# -- rerun 2. a transfer coding after chunked ---------------------------------------------------------

TE_NOT_CHUNKED_LAST = {
    # chunked not last: the body is close-delimited and still carries the chunked framing
    "chunked-then-gzip": b"Transfer-Encoding: chunked, gzip\r\n",
    "chunked-then-gzip-in-two-lines": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
    "gzip-alone": b"Transfer-Encoding: gzip\r\n",
}


@pytest.mark.parametrize("shape", sorted(TE_NOT_CHUNKED_LAST))
async def test_rerun_2_a_transfer_encoding_not_ending_in_chunked_is_a_502(start, up, shape):
    """Its body ends only with the connection and keeps whatever framing an inner ``chunked`` left
    (RFC 9112 §6.1, §6.3): the client gets a static 502 and none of the upstream's bytes, the
    upstream connection is closed by the router, the log says why, and it counts as the model
    server's failure."""
    p = await start()
    rid = wire.new_id()
    up.scripts[rid] = wire.Script(
        [
            b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\n%s\r\n5\r\nhello\r\n0\r\n\r\n"
            % (rid.encode(), TE_NOT_CHUNKED_LAST[shape])
        ],
        then="hold",  # the body never ends: only the router can close this connection
    )
    before = await _counted(p)
    client = await _open(p)
    await client.send(_get(rid))
    answer = await client.response("GET")
    assert answer is not None and answer.status == 502, f"got {answer and answer.status} {answer and answer.body!r}"
    assert answer.echo_id is None and b"hello" not in client.raw and b"gzip" not in client.raw, bytes(client.raw)
    assert not wire.framing_faults(answer)
    sentinel = await _sentinel(client, up)  # the client connection goes on
    client.close()
    (seen,) = up.by_id(rid)
    assert sentinel.conn != seen.conn, "the upstream connection was used again"
    await wait_until(lambda: seen.conn in up.closed_by_router, timeout=5, what="the router closed the upstream")
    await _idle(p)
    assert wire.delta(before, await _counted(p)) == {("502", "upstream_error"): 1.0, ("200", "completed"): 1.0}
    event = await p.wait_event("proxy.upstream_invalid")
    assert "Transfer-Encoding" in event["error"] and "does not end in one chunked" in event["error"], event
    assert [e["event"] for e in p.events].count("proxy.upstream_invalid") == 1
