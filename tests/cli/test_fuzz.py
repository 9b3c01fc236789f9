"""Fuzz the traffic listener with hostile and malformed raw requests (hypothesis), black-box.

One real router process in front of a healthy in-process model server, with a canary listener on
another loopback port that many of the generated requests name (as an authority, an absolute URL, a
Host, a userinfo trick). Whatever the bytes: the canary never gets a connection, no answer is a 500
or a 502/503/504 (the model server is healthy: nothing may be blamed on it), nothing is counted
``upstream_error``, in-flight returns to 0 and the router still serves. And the parser boundary
itself (framing: duplicated or signed Content-Length, Transfer-Encoding with Content-Length, odd chunk
sizes and extensions, bare LF or CR line ends, odd bytes in header names and values, pipelined
requests behind a body): once a client has sent its bytes and closed its side, the router ends the
exchange within a deadline (never a hang), and the process stays alive.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drain_router_dev.fake_model import testing as fake_model_testing
from drain_router_dev.process import wait_until
from tests import process
from tests.blackbox import Canary, canary, status_of

READ_TIMEOUT = 0.5
#: A client that has sent everything and closed its side sees the router close within this long
#: (the router's header timeout is 1 s here; the model server answers at once).
HANG_DEADLINE = 3.0


@dataclass
class World:
    port: int
    admin_port: int
    canary: Canary
    fake: fake_model_testing.FakeModel
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The model server and the canary on a loop in a thread; the router as a real process."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    holder: dict[str, object] = {}

    async def serve() -> None:
        async with fake_model_testing.running() as fake, canary() as spy:
            holder.update(fake=fake, spy=spy)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    fake, spy = holder["fake"], holder["spy"]
    assert isinstance(fake, fake_model_testing.FakeModel) and isinstance(spy, Canary)
    proc = subprocess.Popen(
        process.serve_argv(
            "--upstream",
            fake.url,
            "--shutdown-drain-secs",
            "0",
            "--client-header-timeout-secs",
            "1",
            "--max-request-body-bytes",
            "65536",
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[dict[str, object]] = []
    for raw in proc.stdout:
        event = json.loads(raw)
        lines.append(event)
        if event["event"] == "startup.listening":
            break
    drainer = threading.Thread(target=lambda: [lines.append(json.loads(r)) for r in proc.stdout], daemon=True)
    drainer.start()
    try:
        yield World(port=int(event["port"]), admin_port=int(event["admin_port"]), canary=spy, fake=fake, proc=proc)
    finally:
        proc.terminate()
        code = proc.wait(10)
        drainer.join(5)
        proc.stdout.close()
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
    assert code == 0
    assert not [e for e in lines if e.get("level") == "error"], "no client input is logged as an error"


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT) as sock:
        try:
            sock.sendall(data)
        except OSError:
            return b""
        out = b""
        deadline = time.monotonic() + READ_TIMEOUT
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            out += chunk
        return out


def _exchange_half_closed(port: int, data: bytes) -> tuple[bytes, float | None]:
    """Send ``data``, close the sending side, read until the router closes. Returns what came back
    and how long the close took after the send (None: still open at :data:`HANG_DEADLINE`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_DEADLINE) as sock:
        started = time.monotonic()
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b"", time.monotonic() - started  # the router closed while we sent: ended
        out = b""
        deadline = started + HANG_DEADLINE
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:  # reset: ended
                return out, time.monotonic() - started
            if not chunk:
                return out, time.monotonic() - started
            out += chunk
        return out, None


def _admin_json(world: World, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{world.admin_port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def _requests_by_outcome(world: World) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{world.admin_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("drain_router_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0) + float(line.rsplit(" ", 1)[1])
    return out


CANARY = "127.0.0.1:{canary}"
methods = st.sampled_from(
    ["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "CONNECT", "TRACE", "PRI", "G ET", "get", "GET\x00"]
) | st.text(min_size=1, max_size=8)
targets = st.sampled_from(
    [
        "/",
        "/echo",
        "/sse?n=2&iv=0",
        "*",
        "http://{c}/",
        "http://{c}/echo",
        "HTTP://{c}/",
        "{c}",
        "@{c}",
        "@{c}/echo",
        "//{c}/echo",
        "/@{c}/echo",
        "http://user@{c}/",
        "https://{c}/",
        "http://[::1]:{p}/",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/echo#frag",
        "/echo\\r\\nX: y",
        "/" + "a" * 9000,
    ]
) | st.text(max_size=30)
versions = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1 x", "", "http/1.1"])
header_lines = st.lists(
    st.sampled_from(
        [
            "Host: x",
            "Host: {c}",
            "Host: ",
            "Host: a\x00b",
            "Content-Length: 5",
            "Content-Length: -1",
            "Content-Length: abc",
            "Content-Length: 99999999999",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: chunked, identity",
            "Transfer-Encoding: xchunked",
            " Transfer-Encoding: chunked",
            "Connection: Host",
            "Connection: close",
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Expect: 100-continue",
            "X-Forwarded-For: {c}",
            "Forwarded: for=evil;host={c}",
            "Proxy-Connection: keep-alive",
            "X" * 9000 + ": y",
            "Bad Header",
            ": empty",
            "X-Fold: a\r\n b",
        ]
    )
    | st.text(max_size=40),
    max_size=8,
)
bodies = st.sampled_from(
    [b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n", b"0\r\n\r\n", b"zz\r\n", b"GET / HTTP/1.1\r\n\r\n"]
) | st.binary(max_size=64)
structured = st.builds(
    lambda m, t, v, hs, b: (
        (f"{m} {t} {v}\r\n" + "".join(h + "\r\n" for h in hs) + "\r\n").encode("utf-8", "replace") + b
    ),
    methods,
    targets,
    versions,
    header_lines,
    bodies,
)
raw_requests = structured | st.binary(min_size=1, max_size=200)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=raw_requests)
def test_no_raw_request_escapes_or_blames_the_model_server(world: World, data: bytes) -> None:
    data = data.replace(b"{c}", CANARY.format(canary=world.canary.port).encode())
    data = data.replace(b"{p}", str(world.canary.port).encode())
    before = world.canary.connections
    answer = _exchange(world.port, data)
    assert world.canary.connections == before, f"the router connected to the canary for {data[:120]!r}"
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:80]
        status = status_of(answer)
        assert status not in (500, 502, 503, 504), (data[:200], answer[:300])
        head = answer.split(b"\r\n\r\n", 1)[0]
        assert b"Traceback" not in answer
        if b"Server: drain-router" in head:  # the router's own answer (a proxied one is the model server's)
            assert b"aiohttp" not in answer and b"Python" not in answer, answer[:300]


# The parser boundary, at the byte level: framing that proxies have disagreed on (request smuggling),
# line ends, odd bytes in header names and values, chunk sizes, a request pipelined behind the body.
line_ends = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r"])
framing_headers = st.sampled_from(
    [
        b"Content-Length: 5",
        b"Content-Length: 6",
        b"Content-Length: 0",
        b"Content-Length: +5",
        b"Content-Length: 5, 5",
        b"Content-Length: 5, 6",
        b"Content-Length: 0x5",
        b"Content-Length: 18446744073709551621",
        b"Content-Length : 5",
        b"Content-Length:\t5",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: Chunked",
        b"Transfer-Encoding: chunked, chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: chunked, gzip",
        b"Transfer-Encoding: identity",
        b"Transfer-Encoding : chunked",
        b"Transfer-Encoding:\x0bchunked",
        b"Transfer-Encoding: \x00chunked",
        b"Transfer_Encoding: chunked",
        b"Expect: 100-continue",
        b"Connection: keep-alive",
        b"Connection: close",
    ]
)
odd_headers = st.builds(
    lambda name, value: name + b": " + value,
    st.binary(min_size=1, max_size=10) | st.sampled_from([b"X-Ok", b"X\x7fY", b"X\xffY", b"X Y", b"X\tY", b"X:Y"]),
    st.binary(max_size=16) | st.sampled_from([b"a\x00b", b"a\x7fb", b"\xff\xfe", b"a\rb", b" padded ", b"\t"]),
)
chunk_sizes = st.sampled_from(
    [b"5", b"05", b"0x5", b"-5", b"+5", b" 5", b"5 ", b"5;ext=1", b'5;e="q;x"', b"5;", b"ffffffffffffffff5", b"g", b""]
)
chunked_bodies = st.builds(
    lambda pieces, last, trailer: b"".join(size + b"\r\n" + data + b"\r\n" for size, data in pieces) + last + trailer,
    st.lists(st.tuples(chunk_sizes, st.sampled_from([b"hello", b"hell", b"hello!", b""])), max_size=3),
    st.sampled_from([b"0\r\n", b"0;x=y\r\n", b"00\r\n", b"0\n", b""]),
    st.sampled_from([b"\r\n", b"X-Trailer: t\r\n\r\n", b"Content-Length: 99\r\n\r\n", b"", b"\n"]),
)
pipelined = st.sampled_from(
    [b"", b"GET /echo?pipelined HTTP/1.1\r\nHost: x\r\n\r\n", b"GET http://{c}/ HTTP/1.1\r\n\r\n"]
)
framed = st.builds(
    lambda method, target, eol, headers, body, behind: (
        method
        + b" "
        + target
        + b" HTTP/1.1"
        + eol
        + b"Host: x"
        + eol
        + b"".join(h + eol for h in headers)
        + eol
        + body
        + behind
    ),
    st.sampled_from([b"POST", b"GET", b"PUT", b"HEAD"]),
    st.sampled_from([b"/echo", b"/sse?n=2&iv=0", b"http://{c}/echo", b"/echo?x=\xff"]),
    line_ends,
    st.lists(framing_headers | odd_headers, max_size=4),
    st.sampled_from([b"", b"hello", b"hello!"]) | chunked_bodies,
    pipelined,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=framed | structured)
def test_every_exchange_ends_and_nothing_escapes(world: World, data: bytes) -> None:
    """Whatever the framing, once the client has sent its bytes and closed its side, the router
    closes the connection within the deadline; no answer is blamed on the model server; the canary
    gets no connection; the process is alive."""
    data = data.replace(b"{c}", CANARY.format(canary=world.canary.port).encode())
    data = data.replace(b"{p}", str(world.canary.port).encode())
    before = world.canary.connections
    answer, took = _exchange_half_closed(world.port, data)
    assert took is not None, f"the exchange did not end within {HANG_DEADLINE}s: {data[:200]!r} -> {answer[:200]!r}"
    assert world.canary.connections == before, f"the router connected to the canary for {data[:120]!r}"
    assert world.proc.poll() is None, f"the router exited on {data[:200]!r}"
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:80]
        assert status_of(answer) not in (500, 502, 503, 504), (data[:200], answer[:300])


async def test_after_the_fuzz_nothing_is_blamed_on_the_model_server_and_it_still_serves(world: World) -> None:
    """Runs after the fuzz (same module, same router): counts and in-flight are sane."""
    await wait_until(
        lambda: _admin_json(world, "/admin/inflight")["inflight"], 5, "in-flight 0", until=lambda now: now == 0
    )
    outcomes = _requests_by_outcome(world)
    assert outcomes.get("upstream_error", 0) == 0, outcomes
    assert outcomes.get("rejected", 0) > 0, outcomes
    answer = _exchange(world.port, b"GET /sse?n=2&iv=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 200 and b"data: [DONE]" in answer
    assert world.canary.connections == 0
    assert world.proc.poll() is None
    with urllib.request.urlopen(f"http://127.0.0.1:{world.admin_port}/livez", timeout=5) as resp:
        assert resp.status == 200
