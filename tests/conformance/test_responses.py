"""Upstream → router → client: generated response bytes from a raw upstream (Content-Length, chunked
with extensions and trailers, close-delimited, none; surplus after the framed end: a second response,
a body on 204/304/HEAD, extra bytes; 1xx interim responses before the final one; bad statuses, an
unrequested 101, ``Connection: content-length``, oversized heads), written in arbitrary pieces.

The invariants ("One request in, one response out", "Bounds both ways"):

- the client (an h11 client) gets exactly one final response per request, well framed, in order: a
  valid upstream response is relayed with its status and body; an invalid or oversized one becomes a
  502;
- a ``103`` reaches an HTTP/1.1 client before the final response, never an HTTP/1.0 one, and never
  with the ``Content-Length`` or ``Transfer-Encoding`` the upstream put on it;
- a ``Transfer-Encoding`` that does not end in ``chunked`` (a close-delimited body) is a 502;
- bytes beyond the framed end are never relayed: the next request on the same client connection gets
  its own response, not one meant for nobody, and it goes up on a fresh upstream connection;
- in-flight returns to 0, and ``requests_total`` counts the status the client received (outcome
  ``completed``, or ``upstream_error`` for the 502s).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.blackbox import wait_idle
from tests.conformance import wire

INTERIM = {
    "100": b"HTTP/1.1 100 Continue\r\n\r\n",
    "103": b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    # No 1xx has a body: relayed without the framing headers an upstream gave it (RFC 9110 §8.6).
    "103-content-length": b"HTTP/1.1 103 Early Hints\r\nLink: </a.js>; rel=preload\r\nContent-Length: 7\r\n\r\n",
    "103-transfer-encoding": (
        b"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\nLink: </b.js>; rel=preload\r\n\r\n"
    ),
}
#: Final heads the router must answer 502 for, with what follows them on the wire.
BAD = {
    "status-000": b"HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nhi",
    "status-999": b"HTTP/1.1 999 Nine\r\nContent-Length: 2\r\n\r\nhi",
    "status-600": b"HTTP/1.1 600 Six\r\nContent-Length: 2\r\n\r\nhi",
    "unrequested-101": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\x81\x02hi",
    "connection-content-length": b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello",
    # Close-delimited by a coding after chunked, or by no chunked at all (RFC 9112 §6.3).
    "transfer-encoding-chunked-not-last": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    "transfer-encoding-without-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhi",
    "connection-transfer-encoding": (
        b"HTTP/1.1 200 OK\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ),
    "huge-header-value": b"HTTP/1.1 200 OK\r\nX-Big: " + b"v" * (1 << 20) + b"\r\nContent-Length: 2\r\n\r\nhi",
    "many-headers": b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 20_000 + b"Content-Length: 2\r\n\r\nhi",
}
SECOND_RESPONSE = b"HTTP/1.1 200 OK\r\nX-Echo-Id: nobody\r\nContent-Length: 6\r\n\r\nnobody"


class Resp:
    """One generated exchange: the request the client sends and the bytes the upstream answers."""

    def __init__(self, rid: str, method: str, http10: bool, upstream_bytes: bytes, then: str) -> None:
        self.id = rid
        self.method = method
        self.http10 = http10
        self.upstream_bytes = upstream_bytes
        self.then = then
        self.status = 502
        self.body = b""
        self.interim: list[str] = []
        """The names of the interim responses (:data:`INTERIM`) before the final one."""
        self.bad: str | None = None
        self.surplus: str | None = None
        self.framing = "length"

    def request(self) -> bytes:
        version = b"HTTP/1.0" if self.http10 else b"HTTP/1.1"
        return b"%s /resp/%s %s\r\nHost: model\r\nX-Req-Id: %s\r\n\r\n" % (
            self.method.encode(),
            self.id.encode(),
            version,
            self.id.encode(),
        )

    def __repr__(self) -> str:
        shown = self.upstream_bytes
        if len(shown) > 400:
            shown = shown[:300] + b"...(%d bytes)" % len(shown)
        what = self.bad or f"{self.status} {self.framing} surplus={self.surplus} interim={self.interim}"
        version = "1.0" if self.http10 else "1.1"
        return f"Resp({self.id}, {self.method} HTTP/{version}, {what}, then={self.then}, upstream={shown!r})"


def _chunked(body: bytes, cuts: list[int], trailer: bool) -> bytes:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    out = bytearray()
    for a, b in itertools.pairwise(points):
        if b > a:
            out += b"%x;ext=%d\r\n%s\r\n" % (b - a, a, body[a:b])
    return bytes(out) + b"0\r\n" + (b"X-Trailer: t\r\n" if trailer else b"") + b"\r\n"


@st.composite
def responses(draw: st.DrawFn, *, bad: str | None = "any") -> Resp:
    rid = wire.new_id("b")
    method = draw(st.sampled_from(["GET", "GET", "HEAD"]))
    http10 = draw(st.integers(0, 4)) == 0
    interim = draw(st.lists(st.sampled_from(sorted(INTERIM)), max_size=2))
    if bad == "any":
        bad = draw(st.sampled_from(sorted(BAD))) if draw(st.integers(0, 4)) == 0 else None
    pre = b"".join(INTERIM[code] for code in interim)
    if bad is not None:
        resp = Resp(rid, method, http10, pre + BAD[bad], "close" if bad == "unrequested-101" else "keep")
        resp.bad, resp.interim = bad, interim
        return resp
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 404, 500, 503]))
    bodyless = status in (204, 304) or method == "HEAD"
    if status in (204, 304):
        framing = draw(st.sampled_from(["none", "length"])) if status == 304 else "none"
    else:
        framing = draw(st.sampled_from(["length", "chunked", "close"] + (["none"] if method == "HEAD" else [])))
    body = b"" if bodyless else draw(st.binary(max_size=4000))
    head = [b"HTTP/1.1 %d Whatever\r\n" % status, b"X-Echo-Id: " + rid.encode() + b"\r\n"]
    wire_body = b""
    if framing == "length":
        head.append(b"Content-Length: %d\r\n" % (len(body) if not bodyless else draw(st.integers(0, 100))))
        wire_body = body
    elif framing == "chunked":
        head.append(b"Transfer-Encoding: chunked\r\n")
        cuts = draw(st.lists(st.integers(0, 4000), max_size=5))
        wire_body = b"" if bodyless else _chunked(body, cuts, draw(st.booleans()))
    elif framing == "close":
        wire_body = body
    surplus = None
    if framing != "close":
        choices = ["second-response", "extra-bytes"] + (["body-on-bodyless"] if bodyless else [])
        surplus = draw(st.sampled_from(choices)) if draw(st.booleans()) else None
    tail = {None: b"", "second-response": SECOND_RESPONSE, "extra-bytes": b"surplus!", "body-on-bodyless": b"bodybody"}
    upstream_bytes = pre + b"".join(head) + b"\r\n" + wire_body + tail[surplus]
    resp = Resp(rid, method, http10, upstream_bytes, "close" if framing == "close" else "keep")
    resp.status, resp.body, resp.interim, resp.surplus, resp.framing = status, body, interim, surplus, framing
    return resp


@st.composite
def scripted(draw: st.DrawFn, *, bad: str | None = "any") -> tuple[Resp, list[int]]:
    resp = draw(responses(bad=bad))
    size = len(resp.upstream_bytes)
    cuts = draw(st.lists(st.integers(1, max(1, size - 1)), max_size=8)) if size < 100_000 else []
    return resp, sorted(set(cuts))


@pytest.fixture(scope="module")
def world() -> Iterator[wire.World]:
    with wire.world("--client-header-timeout-secs", "5") as w:
        yield w


async def _sentinel(w: wire.World, client: wire.Client) -> tuple[wire.Client, str]:
    sid = wire.new_id("s")
    await client.send(b"GET /sentinel/%s HTTP/1.1\r\nHost: model\r\nX-Req-Id: %s\r\n\r\n" % ((sid.encode(),) * 2))
    answer = await client.response("GET")
    assert answer is not None, "the follow-up request on the same connection got no answer"
    assert answer.echo_id == sid, (
        f"the follow-up request got a response meant for {answer.echo_id!r} (status {answer.status}, "
        f"body {answer.body[:80]!r})"
    )
    return client, sid


async def _exchange(w: wire.World, resp: Resp, cuts: list[int]) -> None:
    up = w.up
    bounds = [0, *cuts, len(resp.upstream_bytes)]
    up.scripts[resp.id] = wire.Script(
        [resp.upstream_bytes[a:b] for a, b in itertools.pairwise(bounds) if b > a], then=resp.then
    )
    before = await wire.counted(w.admin_port)
    client = await wire.Client.open(w.port)
    try:
        await client.send(resp.request())
        answer = await client.response(resp.method, close=resp.http10, timeout=10.0)
        assert answer is not None, f"the connection ended without a response; reset={client.reset}"
        faults = wire.framing_faults(answer, method=resp.method, http10=resp.http10)
        assert not faults, faults
        if resp.bad is not None:
            assert answer.status == 502, f"{resp.bad}: the client got {answer.status} {answer.body[:100]!r}"
            assert answer.echo_id is None
        else:
            assert answer.status == resp.status, f"the client got {answer.status}"
            assert answer.echo_id == resp.id
            assert answer.body == resp.body, f"body {answer.body[:100]!r}, sent {resp.body[:100]!r}"
            if any(name.startswith("103") for name in resp.interim) and not resp.http10:
                assert 103 in answer.interim, f"103 not forwarded (interim seen: {answer.interim})"
        seen = up.by_id(resp.id)
        assert len(seen) == 1, f"the request reached the upstream {len(seen)} times"
        if client.h11.our_state is wire.h11.DONE and client.h11.their_state is wire.h11.DONE:
            _, sid = await _sentinel(w, client)
        else:
            extra = await client.rest()
            assert not extra, f"bytes after the final response: {extra[:200]!r}"
            client.close()
            client = await wire.Client.open(w.port)
            _, sid = await _sentinel(w, client)
        if resp.surplus is not None or resp.bad is not None:
            (sentinel,) = up.by_id(sid)
            assert sentinel.conn != seen[0].conn, (
                "the upstream connection that sent surplus (or an invalid response) was used again"
            )
    finally:
        client.close()
    await wait_idle(w.admin_port)
    assert not up.violations, up.violations
    got = Counter(wire.delta(before, await wire.counted(w.admin_port)))
    want = Counter({(str(answer.status), "upstream_error" if resp.bad else "completed"): 1.0})
    want[("200", "completed")] += 1.0  # the sentinel
    assert got == want, f"requests_total counted {dict(got)}; the client received {answer.status} (+ the sentinel)"


@settings(wire.QUICK, max_examples=80)
@given(case=scripted())
def test_generated_responses_reach_the_client_one_for_one(world, case):
    resp, cuts = case
    world.run(_exchange(world, resp, cuts))


@pytest.mark.parametrize("bad", sorted(BAD))
def test_each_invalid_upstream_response_is_a_502(world, bad):
    @settings(wire.QUICK, max_examples=2)
    @given(case=scripted(bad=bad))
    def one(case):
        resp, cuts = case
        world.run(_exchange(world, resp, cuts))

    one()


@pytest.mark.parametrize("surplus", ["second-response", "extra-bytes", "body-on-bodyless"])
def test_each_kind_of_surplus_is_dropped(world, surplus):
    @settings(wire.QUICK, max_examples=4)
    @given(case=scripted(bad=None).filter(lambda c: c[0].surplus == surplus))
    def one(case):
        resp, cuts = case
        world.run(_exchange(world, resp, cuts))

    one()
