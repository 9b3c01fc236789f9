"""A generated, stateful test of the gRPC listener (hypothesis ``RuleBasedStateMachine``), black-box
against a real router process, checked by code independent of the router's (hyperframe, hpack and
the checks here and in :mod:`tests.recordingh2upstream`).

Each example is one client connection. Its steps are frames, valid and invalid: new streams with a
valid or a malformed head (RFC 9113 §8.2-8.3), sent whole or across CONTINUATION frames; DATA with or
without END_STREAM, empty or full-sized; trailers, valid or not, and second HEADERS; RST_STREAM;
WINDOW_UPDATE (0, overflow); PRIORITY (self-dependency); PING; SETTINGS (invalid values); frames on
idle and closed streams; an interrupted header block; unknown frame types; and calls of a bystander.
Frames on any stream the example opened (still open or not) are chosen freely. Each stream also
chooses what the model server does with it (:data:`tests.recordingh2upstream.BEHAVIOURS`: answers,
resets, a malformed head, trailers-only, malformed trailers, GOAWAY, DATA past the window, closes its
connection) and when: as the stream arrives, at a later step (``model_server_acts``), or never. After
every step a PING's acknowledgement proves the router read what the client sent.

Invariants, checked at the end of each example:

1. In flight (``/admin/inflight``) returns to 0 within :data:`INFLIGHT_SECS` once the client's
   connection is closed.
2. Every stream's call ends exactly once: each stream that reached the model server logs exactly one
   ``grpc.call`` event (``--access-log``), no stream logs two, and the calls counted by
   ``drain_router_grpc_requests_total`` during the example are exactly the streams the router
   admitted: those that reached the model server, those it answered or reset itself (except with
   REFUSED_STREAM, which says a stream was never processed, §8.7), and those it logged.
3. The model server never receives what RFC 9113 forbids in a header block: invalid or uppercase
   names, connection-specific fields, ``te`` other than ``trailers``, NUL/CR/LF or edge whitespace
   in values, unknown or repeated pseudo-headers, pseudo-headers after regular fields or in trailers,
   trailers without END_STREAM (§8.1); nor a header block or DATA after the router ended or reset
   that stream (§5.1).
4. A bystander on its own connection, whose calls the model server always answers, gets its answer
   (during the example and at its end). It may lose a call to UNAVAILABLE only in an example whose
   model server closed a connection (then the next call must succeed), and may be refused
   (REFUSED_STREAM, retried as gRPC does) only in one whose model server sent GOAWAY.
5. What the router sends the client follows the same rules: response heads and trailers without
   forbidden fields, and no frame on a stream after the router's RST_STREAM, nor HEADERS or DATA
   after its END_STREAM (§5.1).
6. The router's RSS grows less than :data:`RSS_GROWTH_BOUND` (64 MiB) over all the examples it
   serves (from its RSS after its first call).

Assumptions where RFC 9113 leaves a choice: DATA from the model server past a stream's window (not
the connection's) is a stream error for the router, not a connection error (so the bystander keeps
its calls on that connection); a stream rejected for a malformed head is counted (``rejected``) but
need not log a ``grpc.call`` event, since it never became a call; a stream refused with
REFUSED_STREAM by the router before it reached the model server is not admitted.

One router process serves every example; it is replaced only when an example left calls in flight
(so that one leak does not fail every later example and hypothesis can shrink).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
import hpack
import psutil
import pytest
from hyperframe import frame as hf
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test

from drain_router_dev import process as process_
from tests import recordingh2upstream as rec
from tests.grpc.conftest import grpc_requests, inflight
from tests.h2client import RawClient, message, request_headers
from tests.process import RouterProcess

T = TypeVar("T")

RSS_GROWTH_BOUND = 64 * 1024 * 1024
INFLIGHT_SECS = 2.0
"""How long the router has to notice a closed client connection (it takes milliseconds)."""
ANSWER_SECS = 5.0
"""How long the bystander waits for an answer (the model server answers at once)."""
SERVICE = "/stateful.Test"
MAX_WINDOW = 2**31 - 1
REFUSED_STREAM = 7
NO_ERROR = 0

# Frame types and flags of frames written byte by byte (hyperframe refuses to build invalid ones).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4

MALFORMED_HEADS = (
    "uppercase",
    "connection",
    "te_gzip",
    "crlf_value",
    "nul_value",
    "edge_space",
    "unknown_pseudo",
    "pseudo_after_regular",
    "missing_path",
)
TRAILERS = ("valid", "valid_no_end", "pseudo", "uppercase", "connection")
SETTINGS_KINDS = {
    "empty": b"",
    "window_0": b"\x00\x04\x00\x00\x00\x00",
    "window_max": b"\x00\x04" + MAX_WINDOW.to_bytes(4, "big"),
    "window_over": b"\x00\x04\x80\x00\x00\x00",  # past 2^31-1: FLOW_CONTROL_ERROR (§6.5.2)
    "frame_size_small": b"\x00\x05\x00\x00\x00\x10",  # below 16384: PROTOCOL_ERROR
    "enable_push_2": b"\x00\x02\x00\x00\x00\x02",  # neither 0 nor 1: PROTOCOL_ERROR
    "table_0": b"\x00\x01\x00\x00\x00\x00",
    "unknown_id": b"\x00\xff\x00\x00\x00\x01",  # ignored (§6.5.2)
    "bad_length": b"\x00\x04\x00\x00",  # not a multiple of 6: FRAME_SIZE_ERROR
}
HARMLESS_FRAMES = (
    "ping",
    "ping_ack",  # unsolicited: ignored
    "settings_empty",
    "settings_window_0",
    "settings_window_max",
    "settings_table_0",
    "settings_unknown_id",
    "unknown_type",
    "idle_priority",
)
"""Connection-level frames a server must take (two thirds of the choices: the others end the
connection, and with it the example's interesting part)."""
HARMLESS = st.sampled_from(HARMLESS_FRAMES)
FATAL_FRAMES = (
    "settings_window_over",
    "settings_frame_size_small",
    "settings_enable_push_2",
    "settings_bad_length",
    "idle_data",
    "idle_window_update",
    "idle_rst_stream",
    "idle_continuation",
    "headers_even",
    "interrupted_by_ping",
    "interrupted_by_data",
    "interrupted_by_continuation_elsewhere",
)


def frame_bytes(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def head_for(head: str, path: str) -> list[tuple[str, str]]:
    fields = request_headers(path)
    extra = {
        "uppercase": [("X-Upper", "1")],
        "connection": [("connection", "keep-alive")],
        "te_gzip": [("te", "gzip")],
        "crlf_value": [("x-bad", "a\r\nb")],
        "nul_value": [("x-bad", "a\x00b")],
        "edge_space": [("x-bad", " a")],
    }
    if head in extra:
        return fields + extra[head]
    if head == "unknown_pseudo":
        return [(":foo", "bar"), *fields]
    if head == "pseudo_after_regular":
        return [f for f in fields if f[0] != ":authority"] + [(":authority", "router")]
    if head == "missing_path":
        return [f for f in fields if f[0] != ":path"]
    return fields


def trailers_for(kind: str) -> list[tuple[str, str]]:
    return {
        "pseudo": [(":path", "/again")],
        "uppercase": [("X-Trailer", "1")],
        "connection": [("connection", "close")],
    }.get(kind, [("x-trailer", "1")])


@dataclass
class Env:
    """What every example shares: the recording model server and the router in front of it."""

    upstream: rec.Server
    router: RouterProcess
    baseline_rss: int = 0
    peak_growth: int = 0
    examples: itertools.count[int] = field(default_factory=itertools.count)
    tokens: itertools.count[int] = field(default_factory=itertools.count)
    restarts: int = 0


async def _start_router(upstream_port: int) -> RouterProcess:
    router = await RouterProcess.start(
        "--upstream", "http://127.0.0.1:9", "--shutdown-drain-secs", "0", "--access-log",
        "--grpc-port", "0", "--grpc-upstream", f"http://127.0.0.1:{upstream_port}",
    )  # fmt: skip
    await router.wait_event("startup.listening")
    return router


def _rss(router: RouterProcess) -> int:
    pid = router.proc.pid
    assert pid is not None
    return int(psutil.Process(pid).memory_info().rss)


async def _warm(env: Env) -> None:
    """One bystander call on a fresh router, so the baseline RSS includes what any call loads."""
    port = env.router.grpc_port
    assert port is not None
    client = await RawClient.connect(port)
    try:
        result = await Bystander(client, env, "warm").call()
        assert result == "ok", result
    finally:
        client.close()
    env.baseline_rss = _rss(env.router)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with rec.running() as upstream:
        router = asyncio.run(_start_router(upstream.port))
        shared = Env(upstream, router)
        try:
            asyncio.run(_warm(shared))
            yield shared
        finally:
            shared.router.proc.kill()


def _ended(client: RawClient, sid: int) -> bool:
    return any(
        isinstance(s.frame, hf.RstStreamFrame)
        or (isinstance(s.frame, (hf.HeadersFrame, hf.DataFrame)) and "END_STREAM" in s.frame.flags)
        for s in client.frames
        if s.frame.stream_id == sid
    )


LOST = "upstream connection lost"


@dataclass
class Bystander:
    """A well-behaved client on its own connection: whole unary calls the model server always
    answers, retried on REFUSED_STREAM as a gRPC client does."""

    client: RawClient
    env: Env
    prefix: str
    next_sid: int = 1
    tokens: dict[int, str] = field(default_factory=dict)
    results: list[str] = field(default_factory=list)

    async def call(self) -> str:
        """One call: ``ok``, :data:`LOST`, or what went wrong (``refused`` is noted per retry)."""
        for _ in range(3):
            sid, self.next_sid = self.next_sid, self.next_sid + 2
            token = self.tokens[sid] = f"{self.prefix}b{next(self.env.tokens)}"
            body = token.encode()
            self.client.call(sid, f"{SERVICE}/{rec.BYSTANDER}.{token}", body)
            try:
                await self.client.wait_for(
                    lambda c, sid=sid: _ended(c, sid), ANSWER_SECS, f"the bystander's answer ({sid})"
                )
            except AssertionError as exc:
                return f"no answer: {exc}"
            resets = self.client.of(hf.RstStreamFrame, sid)
            if resets and resets[0].error_code == REFUSED_STREAM:
                self.results.append("refused")
                continue
            whole = any("END_STREAM" in f.flags for f in self.client.of(hf.HeadersFrame, sid))
            if resets and not (whole and resets[0].error_code == NO_ERROR):
                # (NO_ERROR after the whole response only asks the client to stop sending: §8.1)
                return f"reset {resets[0].error_code}"
            self.client.decode_all()
            blocks = self.client.response_headers(sid)
            trailers = dict(blocks[-1]) if blocks else {}
            status, data = trailers.get(b"grpc-status"), self.client.received_data(sid)
            if status == b"14" and b"connection was lost" in trailers.get(b"grpc-message", b""):
                return LOST
            if status != b"0" or data != message(body):
                return f"grpc-status {status!r} {trailers.get(b'grpc-message')!r}, data {data!r}"
            return "ok"
        return "refused three times"


async def _cancel_all() -> None:
    """Cancel the loop's other tasks (the clients' readers) and wait for them."""
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _answered(client: RawClient, sid: int) -> bool:
    """The router sent something on ``sid`` other than REFUSED_STREAM (a stream never processed)."""
    return any(
        not (isinstance(f, hf.RstStreamFrame) and f.error_code == REFUSED_STREAM) for f in client.of(hf.Frame, sid)
    )


def _router_frame_problems(client: RawClient, sids: dict[int, str]) -> list[str]:
    """Invariant 5: the router's frames to the client, per stream, decoded here in arrival order."""
    decoder = hpack.Decoder()
    problems: list[str] = []
    ended: set[int] = set()
    reset: set[int] = set()
    finals: dict[int, int] = {}  # header blocks after the final head, per stream
    block: tuple[int, bool, bytearray] | None = None
    for seen in client.frames:
        f = seen.frame
        sid = f.stream_id
        if sid == 0:
            continue
        name = type(f).__name__.replace("Frame", "")
        if sid in reset:
            problems.append(f"{name} on stream {sid} after the router reset it")
        elif sid in ended and not isinstance(f, (hf.RstStreamFrame, hf.WindowUpdateFrame, hf.ContinuationFrame)):
            problems.append(f"{name} on stream {sid} after the router's END_STREAM")
        if isinstance(f, hf.RstStreamFrame):
            reset.add(sid)
            continue
        end = "END_STREAM" in f.flags
        if isinstance(f, hf.DataFrame):
            if sid not in finals:
                problems.append(f"DATA on stream {sid} before a response head (§8.1)")
            if end:
                ended.add(sid)
        if isinstance(f, hf.HeadersFrame):
            block = (sid, end, bytearray(f.data))
            if end:
                ended.add(sid)
        elif isinstance(f, hf.ContinuationFrame) and block is not None:
            block[2].extend(f.data)
        if block is None or "END_HEADERS" not in f.flags:
            continue
        bsid, bend, data = block
        block = None
        try:
            headers = [(bytes(n), bytes(v)) for n, v in decoder.decode(bytes(data), raw=True)]
        except hpack.HPACKError as exc:
            problems.append(f"undecodable header block on stream {bsid}: {exc!r}")
            return problems
        if bsid not in finals:
            found = rec.head_problems(headers, request=False)
            status = dict(headers).get(b":status", b"")
            if not (status.startswith(b"1") and len(status) == 3):
                finals[bsid] = 0
        else:
            finals[bsid] += 1
            found = rec.trailer_problems(headers, end_stream=bend)
            if finals[bsid] > 1:
                found.append("a third header block (§8.1)")
        problems += [f"stream {bsid} ({sids.get(bsid, '?')}): {p}" for p in found]
    return problems


class GrpcListener(RuleBasedStateMachine):
    streams = Bundle("streams")

    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.loop = asyncio.new_event_loop()
        self.example = f"e{next(env.examples)}"
        self.violations_from = len(env.upstream.recorder.violations)
        try:
            clean = env.router.proc.returncode is None and self.run(inflight(env.router)) == 0
        except aiohttp.ClientError:
            clean = False
        if not clean:
            self.restart()
        port = env.router.grpc_port
        assert port is not None
        self.client = self.run(RawClient.connect(port))
        self.bystander = Bystander(self.run(RawClient.connect(port)), env, self.example)
        self.counted_before = self.run(grpc_requests(env.router))
        self.next_sid = 1
        self.tokens: dict[int, str] = {}
        self.behaviours: dict[int, str] = {}
        self.pings = itertools.count()

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def restart(self) -> None:
        """A router that kept calls in flight after an example is replaced (see the docstring)."""
        self.env.router.proc.kill()
        self.env.router = self.run(_start_router(self.env.upstream.port))
        self.env.restarts += 1
        self.run(_warm(self.env))

    # -- the client's frames ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.client.writer.is_closing():
            self.client.writer.write(data)

    def sync(self) -> None:
        """A PING, and its acknowledgement (or the connection's end): the router read every frame
        before it."""
        opaque = b"sync" + next(self.pings).to_bytes(4, "big")

        def acked(c: RawClient) -> bool:
            pongs = [f for f in c.of(hf.PingFrame) if "ACK" in f.flags and f.opaque_data == opaque]
            return bool(pongs) or c.closed or bool(c.of(hf.GoAwayFrame))

        self.write(frame_bytes(PING, 0, 0, opaque))
        self.run(self.client.wait_for(acked, 10, "the PING's acknowledgement"))

    @rule(
        target=streams,
        head=st.just("valid") | st.sampled_from(MALFORMED_HEADS),
        behaviour=st.sampled_from(rec.BEHAVIOURS),
        at_once=st.booleans(),
        end_stream=st.booleans(),
        continuations=st.integers(0, 2),
    )
    def open_stream(self, head: str, behaviour: str, at_once: bool, end_stream: bool, continuations: int) -> int:
        """A new stream; its model server's behaviour happens as soon as it arrives, or when
        :meth:`model_server_acts` says (or never)."""
        sid, self.next_sid = self.next_sid, self.next_sid + 2
        token = f"{self.example}s{sid}"
        self.tokens[sid] = token
        self.behaviours[sid] = behaviour
        if at_once:
            self.env.upstream.act(token)
        block = self.client.encoder.encode(head_for(head, f"{SERVICE}/{behaviour}.{token}"))
        cut = [len(block) * i // (continuations + 1) for i in range(continuations + 2)]
        parts = [block[a:b] for a, b in itertools.pairwise(cut)]
        out = frame_bytes(
            HEADERS, (END_STREAM if end_stream else 0) | (0 if continuations else END_HEADERS), sid, parts[0]
        )
        for i, part in enumerate(parts[1:], 1):
            out += frame_bytes(CONTINUATION, END_HEADERS if i == continuations else 0, sid, part)
        self.write(out)
        self.sync()
        return sid

    @rule(sid=streams, size=st.sampled_from([0, 1, 100, 16_384]), end_stream=st.booleans())
    def data(self, sid: int, size: int, end_stream: bool) -> None:
        self.write(frame_bytes(DATA, END_STREAM if end_stream else 0, sid, b"d" * size))
        self.sync()

    @rule(sid=streams, kind=st.sampled_from(TRAILERS))
    def trailers(self, sid: int, kind: str) -> None:
        """Trailers, or a second HEADERS on a stream the client already ended (§8.1, §5.1)."""
        block = self.client.encoder.encode(trailers_for(kind))
        flags = END_HEADERS | (0 if kind == "valid_no_end" else END_STREAM)
        self.write(frame_bytes(HEADERS, flags, sid, block))
        self.sync()

    @rule(sid=streams, code=st.sampled_from([0, 2, 8]))
    def rst_stream(self, sid: int, code: int) -> None:
        self.write(frame_bytes(RST_STREAM, 0, sid, code.to_bytes(4, "big")))
        self.sync()

    @rule(sid=st.one_of(st.just(0), streams), increment=st.sampled_from([0, 1, 65_535, MAX_WINDOW]))
    def window_update(self, sid: int, increment: int) -> None:
        self.write(frame_bytes(WINDOW_UPDATE, 0, sid, increment.to_bytes(4, "big")))
        self.sync()

    @rule(sid=streams, self_dependency=st.booleans())
    def priority(self, sid: int, self_dependency: bool) -> None:
        depends_on = sid if self_dependency else 0
        self.write(frame_bytes(PRIORITY, 0, sid, depends_on.to_bytes(4, "big") + b"\x10"))
        self.sync()

    @rule(kind=st.one_of(HARMLESS, HARMLESS, st.sampled_from(FATAL_FRAMES)), ahead=st.integers(0, 3))
    def connection_frame(self, kind: str, ahead: int) -> None:
        """A frame that is not about one of the example's streams: PING, SETTINGS (some invalid),
        an extension frame (ignored, §5.5), a frame on an idle stream (odd and above the last, or
        even), an interrupted header block (§6.10)."""
        idle = self.next_sid + 2 * ahead
        if kind in ("ping", "ping_ack"):
            out = frame_bytes(PING, 1 if kind == "ping_ack" else 0, 0, b"pingpong")
        elif kind.startswith("settings_"):
            out = frame_bytes(SETTINGS, 0, 0, SETTINGS_KINDS[kind.removeprefix("settings_")])
        elif kind == "unknown_type":
            out = frame_bytes(0x20, 0xFF, idle if ahead % 2 else 0, b"x")
        elif kind == "idle_data":
            out = frame_bytes(DATA, 0, idle, b"idle")
        elif kind == "idle_window_update":
            out = frame_bytes(WINDOW_UPDATE, 0, idle, (1).to_bytes(4, "big"))
        elif kind == "idle_rst_stream":
            out = frame_bytes(RST_STREAM, 0, idle, (8).to_bytes(4, "big"))
        elif kind == "idle_priority":
            out = frame_bytes(PRIORITY, 0, idle, b"\x00\x00\x00\x00\x10")
        elif kind == "idle_continuation":
            out = frame_bytes(CONTINUATION, END_HEADERS, idle, b"")
        elif kind == "headers_even":
            out = frame_bytes(HEADERS, END_HEADERS, idle + 1, self.client.encoder.encode(request_headers()))
        else:  # an interrupted header block, on a new stream
            sid = self.next_sid
            self.next_sid += 2
            self.tokens[sid] = token = f"{self.example}i{sid}"
            block = self.client.encoder.encode(request_headers(f"{SERVICE}/answer.{token}"))
            out = frame_bytes(HEADERS, 0, sid, block[:4])
            if kind == "interrupted_by_ping":
                out += frame_bytes(PING, 0, 0, b"interrup")
            elif kind == "interrupted_by_data":
                out += frame_bytes(DATA, 0, sid, b"x")
            else:
                out += frame_bytes(CONTINUATION, END_HEADERS, sid + 2, block[4:])
        self.write(out)
        self.sync()

    @rule(sid=streams)
    def model_server_acts(self, sid: int) -> None:
        """The model server does what the stream chose (if it has the stream; else on arrival)."""
        token, recorder = self.tokens[sid], self.env.upstream.recorder
        self.env.upstream.act(token)
        if token in recorder.live:
            self.run(process_.wait_until(lambda: token in recorder.settled, 5, "the model server's act"))
        self.sync()

    @rule()
    def bystander_call(self) -> None:
        self.bystander.results.append(self.run(self.bystander.call()))

    # -- the invariants -----------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.check()
        finally:
            self.client.close()
            self.bystander.client.close()
            self.run(_cancel_all())
            self.loop.close()

    def check(self) -> None:
        env, router = self.env, self.env.router
        self.bystander.results.append(self.run(self.bystander.call()))  # with the example's streams open
        self.client.close()
        self.bystander.client.close()

        # 1. In flight returns to 0 once the client is gone.
        try:
            self.run(
                process_.wait_until(lambda: inflight(router), INFLIGHT_SECS, "in-flight 0", until=lambda n: n == 0)
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            pytest.fail(f"in flight did not return to 0 after the client left: {exc}; {self.describe()}")

        # 2. Each call ends exactly once.
        mine = set(self.tokens.values()) | set(self.bystander.tokens.values())
        reached = {t for t in env.upstream.recorder.reached if t in mine}

        def logged() -> dict[str, int]:
            counts: dict[str, int] = {}
            for e in router.events:
                if e.get("event") == "grpc.call":
                    token = rec.behaviour_of(str(e.get("method", "")).encode("latin-1"))[1]
                    if token in mine:
                        counts[token] = counts.get(token, 0) + 1
            return counts

        try:
            self.run(process_.wait_until(logged, 5, "a grpc.call event per stream", until=lambda c: reached <= set(c)))
        except TimeoutError:
            pass  # reported just below
        counts = logged()
        twice = {t: n for t, n in counts.items() if n > 1}
        assert not twice, f"calls that ended more than once (grpc.call events): {twice}; {self.describe()}"
        unlogged = reached - set(counts)
        assert not unlogged, f"streams that reached the model server, never logged ended: {unlogged}; {self.describe()}"
        answered = {t for sid, t in self.tokens.items() if _answered(self.client, sid)}
        answered |= {t for sid, t in self.bystander.tokens.items() if _answered(self.bystander.client, sid)}
        admitted = reached | set(counts) | answered
        counted = self.run(grpc_requests(router))
        ended = sum(counted.values()) - sum(self.counted_before.values())
        assert ended == len(admitted), (
            f"{ended} calls counted ended, {len(admitted)} streams admitted ({sorted(admitted)}); "
            f"counts before {self.counted_before}, after {counted}; {self.describe()}"
        )

        # 3. The model server never received a forbidden field (nor a block or DATA after an end).
        violations = [
            f"{v.token}: {v.what}"
            for v in env.upstream.recorder.violations[self.violations_from :]
            if v.token is None or v.token in mine
        ]
        assert not violations, f"the model server received: {violations}; {self.describe()}"

        # 4. The bystander got its answers; what the model server did to the example's streams
        # excuses a refusal (its GOAWAY) or a lost call (its close), nothing else.
        did = {b for sid, b in self.behaviours.items() if self.tokens[sid] in env.upstream.recorder.acted}
        results = self.bystander.results
        bad = [
            r
            for r in results
            if r != "ok" and not (r == "refused" and "goaway" in did) and not (r == LOST and "close" in did)
        ]
        if results[-1] == LOST and not bad:
            retry = self.retry()
            if retry != "ok":
                bad.append(f"the call after the loss: {retry}")
        assert not bad, f"the bystander's calls: {results} ({bad}); {self.describe()}"

        # 5. What the router sent the client.
        problems = _router_frame_problems(self.client, self.tokens)
        assert not problems, f"the router sent the client: {problems}; {self.describe()}"

        # 6. Bounded memory.
        growth = _rss(router) - env.baseline_rss
        env.peak_growth = max(env.peak_growth, growth)
        assert growth < RSS_GROWTH_BOUND, f"the router's RSS grew {growth >> 20} MiB; {self.describe()}"

    def retry(self) -> str:
        """After the model server closed a connection under the bystander's call, the next call (on
        a new connection to the model server) must succeed."""
        port = self.env.router.grpc_port
        assert port is not None
        client = self.run(RawClient.connect(port))
        try:
            return self.run(Bystander(client, self.env, f"{self.example}r").call())
        finally:
            client.close()

    def describe(self) -> str:
        goaways = [f"GOAWAY {f.error_code} {f.additional_data!r}" for f in self.client.of(hf.GoAwayFrame)]
        return f"client frames: {self.client.summary()} {goaways}"


def _settings() -> settings:
    return settings(
        max_examples=200,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_generated_frame_sequences_keep_the_listeners_invariants(env: Env) -> None:
    class OnThisRouter(GrpcListener):
        def __init__(self) -> None:
            super().__init__(env)

    run_state_machine_as_test(OnThisRouter, settings=_settings())
    late = env.upstream.recorder.violations
    assert not late, f"the model server received: {[f'{v.token}: {v.what}' for v in late]}"
    assert env.peak_growth < RSS_GROWTH_BOUND
