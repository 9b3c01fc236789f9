"""The sans-IO HTTP/2 core under generated frame sequences (hypothesis), in memory: a client-role
peer's frames, valid and invalid, built by hyperframe and hpack, fed in chunks of any size to a
server-role core, with the core's own actions (relaying data, ending, resetting) interleaved.

Invariants, checked after every step by code independent of the core:

- every stream the core handed to a handler is told it left exactly once, and only once it is off
  the connection; when the connection is lost, every stream has been told (nothing stays in flight);
- nothing the client sends on a stream reaches its handler after the client's END_STREAM (RFC 9113
  §5.1, half-closed (remote)) or after the stream left;
- a header list that reaches a handler breaks none of RFC 9113 §8.2's field rules;
- output is bounded (what the core queued between two reads of it);
- the output always parses as HTTP/2 frames (hyperframe), and after a GOAWAY nothing follows.
"""

from __future__ import annotations

import re
from typing import Any

import hpack
from hyperframe import frame as hf
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from drain_router.h2 import frames, rules
from drain_router.h2.connection import Connection
from drain_router.h2.rules import Budgets, Request
from drain_router.h2.streams import Exit, Headers, Stream
from tests.grpc.test_core import REQUEST, QuietEvents, parse

NAME = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9a-z]+$")
FORBIDDEN = {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}

FIELDS = st.sampled_from(
    [
        (b"x-ok", b"1"),
        (b"X-Upper", b"1"),
        (b"connection", b"close"),
        (b"te", b"gzip"),
        (b"te", b"trailers"),
        (b"x-crlf", b"a\r\nb"),
        (b"x-lead", b" a"),
        (b":path", b"/x"),
        (b"grpc-status", b"0"),
        (b"content-length", b"3"),
        (b"host", b"elsewhere"),
    ]
)


SPLIT = st.integers(0, 20_000)


def independent_check(headers: Headers, *, first: bool) -> None:
    """RFC 9113 §8.2 as the tests read it: what may reach the model server."""
    seen_regular = False
    for name, value in headers:
        if name.startswith(b":"):
            assert first and not seen_regular, (name, headers)
            continue
        seen_regular = True
        assert NAME.match(name), name
        assert name not in FORBIDDEN, name
        assert not re.search(rb"[\x00\r\n]|^[ \t]|[ \t]$", value), (name, value)
        assert name != b"te" or value == b"trailers", value


class Handlers(QuietEvents):
    """The role above the core, and every stream's handler: it records what the core told it."""

    def __init__(self) -> None:
        self.closes: dict[int, list[Exit]] = {}
        self.opened: dict[int, Stream] = {}
        self.ended: set[int] = set()
        """Streams whose END_STREAM from the client reached their handler."""

    def goaway_received(self, last_stream: int, code: int) -> None: ...
    def request_rejected(self) -> None: ...

    def stream_requested(self, stream: Stream, headers: Headers, request: Request, end: bool) -> None:
        independent_check(headers, first=True)
        stream.handler = self
        self.opened[stream.sid] = stream
        if end:
            self.ended.add(stream.sid)

    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        independent_check(headers, first=False)
        assert end, "a later block must end its stream"
        self.peer_frame(stream, end)

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        self.peer_frame(stream, end)

    def peer_frame(self, stream: Stream, end: bool) -> None:
        """Nothing from the client reaches a stream after its END_STREAM, or after it left."""
        assert stream.sid not in self.ended and stream.sid not in self.closes, stream.sid
        if end:
            self.ended.add(stream.sid)

    def on_sent(self, stream: Stream, n: int) -> None: ...

    def on_closed(self, stream: Stream, exit: Exit, code: int) -> None:
        self.closes.setdefault(stream.sid, []).append(exit)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.handlers = Handlers()
        self.core = Connection(
            self.handlers, client_side=False, budgets=Budgets(0.0), max_backlog=rules.MAX_QUEUED_OUTPUT_BYTES
        )
        self.core.initiate()
        self.encoder = hpack.Encoder()
        self.pending = bytearray(frames.PREFACE + hf.SettingsFrame(0).serialize())
        self.now = 0.0
        self.next_sid = 1
        self.output = bytearray()
        self.goaway_seen = False

    # -- the client's frames (queued, then delivered in chunks) ---------------------------------

    def sid(self, pick: int) -> int:
        """Mostly the stream the client opened last; else the next one, or an arbitrary one."""
        used = max(1, self.next_sid - 2)
        return [used, used, used, self.next_sid, 2 * (pick % 7) + 1, 2 * pick][pick % 6]

    @rule(extra=st.just([]) | st.lists(FIELDS, max_size=2), end=st.booleans(), split=SPLIT)
    def open_stream(self, extra: list[tuple[bytes, bytes]], end: bool, split: int) -> None:
        block = self.encoder.encode(REQUEST + extra)
        flags = ["END_HEADERS", *(["END_STREAM"] if end else [])]
        self.pending += hf.HeadersFrame(self.next_sid, data=block, flags=flags).serialize()
        self.next_sid += 2
        self.feed(split)

    @rule(pick=st.integers(0, 40), fields=st.lists(FIELDS, max_size=3), end=st.booleans(), split=SPLIT)
    def headers_again(self, pick: int, fields: list[tuple[bytes, bytes]], end: bool, split: int) -> None:
        flags = ["END_HEADERS", *(["END_STREAM"] if end else [])]
        self.pending += hf.HeadersFrame(self.sid(pick), data=self.encoder.encode(fields), flags=flags).serialize()
        self.feed(split)

    @rule(pick=st.integers(0, 40), size=st.integers(0, 20_000), end=st.booleans(), split=SPLIT)
    def data(self, pick: int, size: int, end: bool, split: int) -> None:
        sid = self.sid(pick)
        for at in range(0, max(size, 1), 16_384):
            last = at + 16_384 >= size
            chunk = b"d" * min(16_384, size - at)
            self.pending += hf.DataFrame(sid, data=chunk, flags=["END_STREAM"] if end and last else []).serialize()
        self.feed(split)

    @rule(
        pick=st.integers(0, 40),
        kind=st.sampled_from(["rst", "wu", "wu0", "prio", "prio_self", "ping", "settings", "unknown", "goaway"]),
        split=SPLIT,
    )
    def control(self, pick: int, kind: str, split: int) -> None:
        sid = self.sid(pick)
        frame: Any = {
            "rst": lambda: hf.RstStreamFrame(sid, error_code=8),
            "wu": lambda: hf.WindowUpdateFrame(sid, window_increment=1 + pick * 1000),
            "wu0": lambda: hf.WindowUpdateFrame(sid, window_increment=0),
            "prio": lambda: hf.PriorityFrame(sid, depends_on=0, stream_weight=16),
            "prio_self": lambda: hf.PriorityFrame(sid, depends_on=sid, stream_weight=16),
            "ping": lambda: hf.PingFrame(0, opaque_data=b"12345678"),
            "settings": lambda: hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: pick * 4096}),
            "unknown": lambda: None,
            "goaway": lambda: hf.GoAwayFrame(0, last_stream_id=0, error_code=0),
        }[kind]()
        self.pending += frames.header(3, 0xEE, 0, sid) + b"xyz" if frame is None else frame.serialize()
        self.feed(split)

    def feed(self, split: int) -> None:
        """What the client queued, in two reads split at ``split`` (a frame may be cut anywhere)."""
        data, self.pending = bytes(self.pending), bytearray()
        self.now += 0.05
        self.core.receive(data[:split], self.now)
        self.core.receive(data[split:], self.now)

    # -- the core's own actions (what a relayed call does) ----------------------------------------

    @rule(pick=st.integers(0, 40), size=st.integers(0, 70_000), end=st.booleans())
    def relay_down(self, pick: int, size: int, end: bool) -> None:
        stream = self.core.streams.get(self.sid(pick))
        if stream is not None:
            self.core.send_data(stream, b"r" * size, end)

    @rule(pick=st.integers(0, 40), code=st.sampled_from([frames.CANCEL, frames.NO_ERROR]))
    def reset(self, pick: int, code: int) -> None:
        stream = self.core.streams.get(self.sid(pick))
        if stream is not None:
            self.core.reset(stream, code)

    @rule(pick=st.integers(0, 40), n=st.integers(0, 70_000))
    def grant(self, pick: int, n: int) -> None:
        stream = self.core.streams.get(self.sid(pick))
        if stream is not None:
            self.core.grant(stream, n)

    @rule()
    def take_output(self) -> None:
        self.output += self.core.data_to_send()

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def each_stream_told_once_and_only_once_off(self) -> None:
        for sid, exits in self.handlers.closes.items():
            assert len(exits) == 1, (sid, exits)
            assert sid not in self.core.streams, sid
        for sid in self.handlers.opened:
            assert (sid in self.core.streams) != (sid in self.handlers.closes), sid

    @invariant()
    def output_bounded(self) -> None:
        queued = sum(len(b) for b in self.core.output.queued)
        assert queued <= rules.MAX_QUEUED_OUTPUT_BYTES + 64 * rules.STREAM_WINDOW, queued

    def teardown(self) -> None:
        self.output += self.core.data_to_send()
        found = parse(bytes(self.output))  # hyperframe: every byte is a well-formed frame
        goaways = [i for i, f in enumerate(found) if isinstance(f, hf.GoAwayFrame)]
        assert goaways in ([], [len(found) - 1]), goaways  # a GOAWAY is the last thing sent
        assert bool(goaways) == self.handlers.failed
        self.core.lost()
        for sid in self.handlers.opened:
            assert len(self.handlers.closes.get(sid, [])) == 1, (sid, self.handlers.closes.get(sid))
        assert not self.core.streams


CoreMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_core_under_generated_frames = CoreMachine.TestCase
