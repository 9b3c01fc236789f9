"""Client → router → upstream: generated request streams (several pipelined requests in one write, or
the stream cut at arbitrary offsets into many writes; Content-Length, chunked with extensions and
trailers, no body; hostile headers; sometimes a malformed request after valid ones).

The invariants ("Framing is decided once", "One request in, one response out", "Bounds both
ways"):

- the upstream receives exactly the requests the router accepted, in order, each parseable by h11,
  its body byte-identical to the one sent, with one framing (never Content-Length with
  Transfer-Encoding) and no ``Connection`` naming a framing header;
- the client receives exactly one final response per request, in order, up to and including the
  first one the router refuses (a 4xx of its own), then the connection closes with nothing more;
- what the router refuses never reaches the upstream;
- once the client has left, ``/admin/inflight`` returns to 0.

A request's expected fate is the RFC's, not the router's: ``accept`` (valid), ``reject`` (RFC 9112 or
the router's rules say 400/431), ``either`` (the RFC lets a server accept or reject, e.g. obs-fold, bare LF,
identical duplicate Content-Length) and ``either_close`` (Content-Length with Transfer-Encoding: reject,
or process by the Transfer-Encoding and close after responding, RFC 9112 §6.1).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.blackbox import wait_idle
from tests.conformance import wire

ACCEPT, REJECT, EITHER, EITHER_CLOSE = "accept", "reject", "either", "either_close"

#: Hostile additions, the framing they need, and their fate under RFC 9112 and the router's rules.
HOSTILE: dict[str, tuple[tuple[str, ...], str]] = {
    "connection-content-length": (("length",), REJECT),
    "connection-content-length-keepalive": (("length",), REJECT),
    "connection-transfer-encoding": (("chunked",), REJECT),
    "connection-host": (("none", "length", "chunked"), REJECT),
    "duplicate-cl-differing": (("length",), REJECT),
    "duplicate-cl-same": (("length",), EITHER),
    "cl-and-te": (("chunked",), EITHER_CLOSE),
    "te-not-chunked-last": (("length",), REJECT),
    "space-before-colon": (("length",), REJECT),
    "signed-cl": (("length",), REJECT),
    "obs-fold": (("none", "length", "chunked"), EITHER),
    "bare-lf": (("none", "length"), EITHER),
    "huge-header": (("none", "length", "chunked"), REJECT),
    "absolute-form": (("none",), REJECT),
}

#: Malformed requests that may follow the valid ones: each must be answered 400, then close.
GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: model\r\nNo colon here\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: model\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: model\r\nContent-Length: x\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: model\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


class Req:
    """One generated request: its bytes, and what the RFC and the router's rules let the router do with it
    (a plain class: its repr stays short whatever the size of its bytes)."""

    def __init__(
        self, rid: str, method: str, framing: str, body: bytes, hostile: str | None, close: bool, wire: bytes, fate: str
    ) -> None:
        self.id = rid
        self.method = method
        self.framing = framing
        self.body = body
        self.hostile = hostile
        self.close = close
        self.wire = wire
        self.fate = fate
        self.status = 431 if hostile == "huge-header" else 400
        """The status a refusal must carry."""
        self.may_continue = hostile == "absolute-form"
        """A refusal whose framing is sound: the connection may go on (if the 400 does not say close)."""

    def __repr__(self) -> str:
        shown = self.wire if len(self.wire) < 400 else self.wire[:300] + b"...(%d bytes)" % len(self.wire)
        return f"Req({self.id}, {self.hostile or 'valid'}, {self.framing}, fate={self.fate}, wire={shown!r})"


def _chunks(body: bytes, cuts: list[int], exts: list[str], trailer: bool) -> bytes:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    out = bytearray()
    for i, (a, b) in enumerate(itertools.pairwise(points)):
        if a == b:
            continue
        ext = exts[i % len(exts)] if exts else ""
        out += b"%x%s\r\n%s\r\n" % (b - a, ext.encode(), body[a:b])
    out += b"0\r\n" + (b"X-Trailer: t\r\n" if trailer else b"") + b"\r\n"
    return bytes(out)


@st.composite
def requests(draw: st.DrawFn, *, last: bool, hostile: str | None = "any") -> Req:
    """One request; ``hostile`` names its hostile shape, None for a valid one, ``any`` to draw."""
    rid = wire.new_id("a")
    if hostile == "any":
        hostile = draw(st.sampled_from(sorted(HOSTILE))) if draw(st.integers(0, 3)) == 0 else None
    framings = HOSTILE[hostile][0] if hostile else ("none", "length", "chunked")
    framing = draw(st.sampled_from(framings))
    method = draw(st.sampled_from(["GET", "HEAD", "DELETE"] if framing == "none" else ["POST", "PUT"]))
    body = b"" if framing == "none" else draw(st.binary(min_size=0, max_size=3000))
    close = last and draw(st.booleans()) and hostile is None
    fate = HOSTILE[hostile][1] if hostile else ACCEPT
    target = "/gen/" + rid
    headers: list[bytes] = [b"Host: model", b"X-Req-Id: " + rid.encode()]
    framed = body
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == "chunked":
        cuts = draw(st.lists(st.integers(0, 4000), max_size=6))
        exts = draw(st.lists(st.sampled_from(["", ";a=1", ';n="q;v"', ";x"]), min_size=1, max_size=3))
        framed = _chunks(body, cuts, exts, draw(st.booleans()))
        headers.append(b"Transfer-Encoding: chunked")
    if close:
        headers.append(b"Connection: close")
    sep = b"\r\n"
    if hostile == "connection-content-length":
        headers.append(
            b"Connection: " + draw(st.sampled_from([b"content-length", b"Content-Length", b"CONTENT-LENGTH"]))
        )
    elif hostile == "connection-content-length-keepalive":
        headers.append(b"Connection: Content-Length, keep-alive")
    elif hostile == "connection-transfer-encoding":
        headers.append(b"Connection: transfer-encoding")
    elif hostile == "connection-host":
        headers.append(b"Connection: host")
    elif hostile == "duplicate-cl-differing":
        headers.append(b"Content-Length: %d" % (len(body) + 1 + draw(st.integers(0, 10))))
    elif hostile == "duplicate-cl-same":
        headers.append(b"Content-Length: %d" % len(body))
    elif hostile == "cl-and-te":
        headers.insert(draw(st.integers(1, len(headers))), b"Content-Length: %d" % len(body))
    elif hostile == "te-not-chunked-last":
        headers.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"gzip", b"chunked, gzip", b"identity"])))
    elif hostile == "space-before-colon":
        headers = [h for h in headers if not h.startswith(b"Content-Length")]
        headers.append(b"Content-Length : %d" % len(body))
    elif hostile == "signed-cl":
        headers = [h for h in headers if not h.startswith(b"Content-Length")]
        headers.append(b"Content-Length: +%d" % len(body))
    elif hostile == "obs-fold":
        headers.append(b"X-Folded: first\r\n  second")
    elif hostile == "bare-lf":
        sep = b"\n"
    elif hostile == "huge-header":
        headers.append(b"X-Huge: " + b"h" * draw(st.integers(200_000, 300_000)))
    if hostile == "absolute-form":
        line = f"{method} http://model{target} HTTP/1.1".encode()
    else:
        line = f"{method} {target} HTTP/1.1".encode()
    wire_bytes = sep.join([line, *headers]) + sep + sep + framed
    return Req(rid, method, framing, body, hostile, close, wire_bytes, fate)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Req], bytes | None, list[int]]:
    n = draw(st.integers(1, 5))
    reqs = [draw(requests(last=i == n - 1)) for i in range(n)]
    garbage = draw(st.none() | st.sampled_from(GARBAGE))
    total = sum(len(r.wire) for r in reqs) + len(garbage or b"")
    cuts = draw(st.none() | st.lists(st.integers(1, max(1, total - 1)), max_size=12))
    return reqs, garbage, sorted(set(cuts)) if cuts else []


@pytest.fixture(scope="module")
def world() -> Iterator[wire.World]:
    with wire.world("--client-header-timeout-secs", "5", "--max-request-body-bytes", "1048576") as w:
        yield w


async def _exchange(
    w: wire.World, reqs: list[Req], garbage: bytes | None, cuts: list[int], *, sequential: bool = False
) -> None:
    """Send the stream (cut at ``cuts``; or, ``sequential``, each request once the previous one was
    answered), read the answers with h11, and check them and what the upstream got."""
    up = w.up
    first_seen = len(up.seen)
    stream = b"".join(r.wire for r in reqs) + (garbage or b"")
    bounds = [0, *cuts, len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    client = await wire.Client.open(w.port)
    accepted: list[Req] = []
    story: list[str] = []
    try:
        if not sequential:
            await client.send(*pieces)
        ended = False
        for req in reqs:
            if sequential:
                await client.send(req.wire)
            answer = await client.response(req.method, close=req.close)
            assert answer is not None, (
                f"connection ended without an answer to {req.id} ({req.hostile or 'valid'}, {req.framing}); "
                f"answers so far: {story}; reset={client.reset}"
            )
            faults = wire.framing_faults(answer, method=req.method)
            assert not faults, f"{req.id}: {faults}"
            story.append(f"{req.id}:{answer.status}:{answer.echo_id}")
            if answer.echo_id is not None:
                assert answer.echo_id == req.id, f"response for {answer.echo_id} answered {req.id}: {story}"
                assert req.fate != REJECT, f"{req.id} ({req.hostile}) must be refused, was forwarded: {story}"
                assert answer.status == 200
                assert answer.header(wire.ECHO_SHA) == wire.sha(req.body).encode(), (
                    f"{req.id}: the upstream got a different body ({answer.header(wire.ECHO_LEN)!r} bytes, "
                    f"sent {len(req.body)})"
                )
                accepted.append(req)
                if req.close or req.fate == EITHER_CLOSE:
                    ended = True
                    break
            else:
                assert req.fate != ACCEPT, f"{req.id} (valid, {req.framing}) was refused {answer.status}: {story}"
                assert 400 <= answer.status < 500, f"{req.id}: the router answered {answer.status}: {story}"
                if req.fate == REJECT:
                    assert answer.status == req.status, f"{req.id} ({req.hostile}): {answer.status}, not {req.status}"
                if req.may_continue and client.h11.their_state is wire.h11.DONE:
                    continue  # a refusal that kept the connection: the next requests are answered
                ended = True
                break
        if not ended and garbage is not None:
            if sequential:
                await client.send(garbage)
            answer = await client.response("GET")
            assert answer is not None, f"no 400 for the malformed request after {story}; reset={client.reset}"
            assert answer.status == 400 and answer.echo_id is None, f"the malformed request got {answer.status}"
            ended = True
        if ended:
            extra = await client.rest()
            assert not extra, f"bytes after the last response: {extra[:300]!r}"
        else:
            # The connection stays usable: one more request gets its own answer (no stray response).
            probe = wire.new_id("a")
            await client.send(b"GET /gen/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\n\r\n" % ((probe.encode(),) * 2))
            answer = await client.response("GET")
            assert answer is not None and answer.echo_id == probe, f"the follow-up got {answer}"
            accepted.append(Req(probe, "GET", "none", b"", None, False, b"", ACCEPT))
    finally:
        client.close()
    await wait_idle(w.admin_port)
    ours = up.seen[first_seen:]
    assert not up.violations, up.violations
    assert [s.id for s in ours] == [r.id for r in accepted], "the upstream got other requests than were accepted"
    for seen, req in zip(ours, accepted):
        assert seen.body == req.body
        assert not (seen.values(b"content-length") and seen.values(b"transfer-encoding")), seen.headers
        connection = b",".join(seen.values(b"connection")).lower()
        for name in (b"content-length", b"transfer-encoding", b"host"):
            assert name not in connection, f"forwarded with Connection: {connection!r}"


@settings(wire.QUICK, max_examples=80)
@given(stream=streams())
def test_generated_request_streams_keep_one_response_per_request(world, stream):
    reqs, garbage, cuts = stream
    world.run(_exchange(world, reqs, garbage, cuts))


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_each_hostile_request_meets_its_fate_behind_a_valid_one(world, hostile):
    """Every hostile shape at least once, deterministically, on a connection a valid request was
    answered on (sent once that answer arrived: the pipelining cases are the generated test's)."""

    @settings(wire.QUICK, max_examples=3)
    @given(first=requests(last=False, hostile=None), second=requests(last=True, hostile=hostile))
    def one(first, second):
        world.run(_exchange(world, [first, second], None, [], sequential=True))

    one()
