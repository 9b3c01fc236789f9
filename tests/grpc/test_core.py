"""The sans-IO HTTP/2 core in memory (drain_router.h2.connection): bytes in, handler events out, bytes
pulled. Frames in are built by hyperframe and hpack, frames out parsed by them: flow control, the
state table at work, every way a stream leaves (told once), the budgets and the output bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hpack
import pytest
from hyperframe import frame as hf

from drain_router.h2 import frames, rules
from drain_router.h2.connection import Connection
from drain_router.h2.rules import Budgets, Request
from drain_router.h2.streams import Exit, Headers, State, Stream

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/t.T/Echo"),
    (b":authority", b"router"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


class QuietEvents:
    """The connection's events a test does not watch, and a failure noted."""

    failed = False

    def output_ready(self) -> None: ...
    def stream_gone(self) -> None: ...
    def connection_failed(self) -> None:
        self.failed = True

    def settings_applied(self, values: dict[int, int]) -> None: ...
    def ping_acked(self, opaque: bytes) -> None: ...
    def on_end_sent(self, stream: Stream) -> None: ...
    def on_writable(self, stream: Stream) -> None: ...


@dataclass
class Recorder(QuietEvents):
    """A handler for every stream, and the connection's events: what happened, in order."""

    events: list[tuple[Any, ...]] = field(default_factory=list)
    streams: dict[int, Stream] = field(default_factory=dict)

    def goaway_received(self, last_stream: int, code: int) -> None:
        self.events.append(("goaway", last_stream, code))

    def request_rejected(self) -> None:
        self.events.append(("rejected",))

    def stream_requested(self, stream: Stream, headers: Headers, request: Request, end: bool) -> None:
        stream.handler = self
        self.streams[stream.sid] = stream
        self.events.append(("request", stream.sid, request.path, end))

    # stream events
    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        self.events.append(("headers", stream.sid, end))

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        self.events.append(("data", stream.sid, data, end))

    def on_sent(self, stream: Stream, n: int) -> None:
        self.events.append(("sent", stream.sid, n))

    def on_closed(self, stream: Stream, exit: Exit, code: int) -> None:
        self.events.append(("closed", stream.sid, exit, code))

    def closes(self, sid: int) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == "closed" and e[1] == sid]


class Peer:
    """The other end, written with hyperframe and hpack."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def headers(self, sid: int, headers: list[tuple[bytes, bytes]], *, end: bool = False) -> bytes:
        flags = ["END_HEADERS", *(["END_STREAM"] if end else [])]
        return hf.HeadersFrame(sid, data=self.encoder.encode(headers), flags=flags).serialize()

    @staticmethod
    def data(sid: int, data: bytes, *, end: bool = False) -> bytes:
        return hf.DataFrame(sid, data=data, flags=["END_STREAM"] if end else []).serialize()


def parse(data: bytes) -> list[Any]:
    out, view = [], memoryview(data)
    while view:
        frame, length = hf.Frame.parse_frame_header(view[:9])
        frame.parse_body(view[9 : 9 + length])
        out.append(frame)
        view = view[9 + length :]
    return out


def server(settings: dict[int, int] | None = None) -> tuple[Connection, Recorder, Peer]:
    """A server-role core past the client's preface and SETTINGS; its own opening taken."""
    rec = Recorder()
    core = Connection(rec, client_side=False, budgets=Budgets(0.0), max_backlog=rules.MAX_QUEUED_OUTPUT_BYTES)
    core.initiate()
    opening = hf.SettingsFrame(0)
    opening.settings = settings or {}
    core.receive(frames.PREFACE + opening.serialize(), 0.0)
    core.data_to_send()
    return core, rec, Peer()


def sent(core: Connection) -> list[Any]:
    return parse(core.data_to_send())


def kinds(found: list[Any]) -> list[tuple[str, int, int | None]]:
    return [(type(f).__name__, f.stream_id, getattr(f, "error_code", None)) for f in found]


# -- flow control -------------------------------------------------------------------------------


def test_data_past_the_peers_window_waits_and_goes_when_it_opens() -> None:
    core, rec, peer = server({hf.SettingsFrame.INITIAL_WINDOW_SIZE: 10})
    core.receive(peer.headers(1, REQUEST, end=True), 0.0)
    stream = rec.streams[1]
    assert core.send_data(stream, b"x" * 25, False) == 10
    assert [len(f.data) for f in sent(core) if isinstance(f, hf.DataFrame)] == [10]
    core.receive(hf.WindowUpdateFrame(1, window_increment=5).serialize(), 0.0)
    assert [len(f.data) for f in sent(core) if isinstance(f, hf.DataFrame)] == [5]
    assert ("sent", 1, 5) in rec.events
    core.receive(hf.WindowUpdateFrame(1, window_increment=100).serialize(), 0.0)
    assert [len(f.data) for f in sent(core) if isinstance(f, hf.DataFrame)] == [10]
    assert stream.send_window == 90


def test_the_connection_window_blocks_every_stream_and_releases_them_in_order() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST, end=True) + peer.headers(3, REQUEST, end=True), 0.0)
    one, three = rec.streams[1], rec.streams[3]
    core.receive(hf.WindowUpdateFrame(1, window_increment=100_000).serialize(), 0.0)
    core.receive(hf.WindowUpdateFrame(3, window_increment=100_000).serialize(), 0.0)
    core.send_data(one, b"a" * 65_535, False)  # the whole connection window (65,535)
    core.send_data(three, b"b" * 100, False)
    assert sum(len(f.data) for f in sent(core) if isinstance(f, hf.DataFrame)) == 65_535
    core.receive(hf.WindowUpdateFrame(0, window_increment=60).serialize(), 0.0)
    assert [(f.stream_id, len(f.data)) for f in sent(core) if isinstance(f, hf.DataFrame)] == [(3, 60)]
    assert three.pending and three.sid in core.blocked


def test_a_receive_window_reopens_only_for_bytes_taken_and_in_quarters() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST), 0.0)
    stream = rec.streams[1]
    core.receive(peer.data(1, b"z" * 16_000), 0.0)
    assert stream.recv_window == rules.STREAM_WINDOW - 16_000
    assert not [f for f in sent(core) if isinstance(f, hf.WindowUpdateFrame) and f.stream_id == 1]
    core.grant(stream, 16_000)
    assert not [f for f in sent(core) if isinstance(f, hf.WindowUpdateFrame)]  # below a quarter
    core.grant(stream, rules.STREAM_WINDOW // 4)
    updates = [f for f in sent(core) if isinstance(f, hf.WindowUpdateFrame) and f.stream_id == 1]
    assert [u.window_increment for u in updates] == [16_000 + rules.STREAM_WINDOW // 4]


def test_data_past_a_streams_window_resets_it_with_flow_control_error() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST), 0.0)
    for _ in range(rules.STREAM_WINDOW // 16_384):
        core.receive(peer.data(1, b"z" * 16_384), 0.0)
    core.receive(peer.data(1, b"z" * 16_384), 0.0)
    assert kinds(sent(core))[-1] == ("RstStreamFrame", 1, frames.FLOW_CONTROL_ERROR)
    assert rec.closes(1) == [("closed", 1, Exit.VIOLATION, frames.FLOW_CONTROL_ERROR)]


def test_padding_is_given_back_at_once() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST), 0.0)
    padded = hf.DataFrame(1, data=b"abc", flags=["PADDED"], pad_length=200).serialize()
    core.receive(padded, 0.0)
    assert ("data", 1, b"abc", False) in rec.events
    assert rec.streams[1].ungranted == 201  # the padding and its length byte: taken already
    core.grant(rec.streams[1], rules.STREAM_WINDOW // 4 - 201)
    updates = [f.window_increment for f in sent(core) if isinstance(f, hf.WindowUpdateFrame) and f.stream_id == 1]
    assert updates == [rules.STREAM_WINDOW // 4]


def test_a_new_initial_window_moves_open_streams_and_may_not_overflow_them() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST), 0.0)
    stream = rec.streams[1]
    settings = hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 100})
    core.receive(settings.serialize(), 0.0)
    assert stream.send_window == 100
    core.receive(hf.WindowUpdateFrame(1, window_increment=frames.MAX_WINDOW - 100).serialize(), 0.0)
    assert stream.send_window == frames.MAX_WINDOW
    settings = hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 101})
    core.receive(settings.serialize(), 0.0)
    assert kinds(sent(core))[-1] == ("GoAwayFrame", 0, frames.FLOW_CONTROL_ERROR)
    assert rec.closes(1) == [("closed", 1, Exit.LOST, frames.FLOW_CONTROL_ERROR)]


# -- every way out, told once -------------------------------------------------------------------


def test_headers_after_the_clients_end_resets_the_stream_and_ends_its_call_once() -> None:
    """Defect 1: HEADERS again after END_STREAM (half-closed remote) is STREAM_CLOSED, and the
    stream's handler is told it left (its call ends) exactly once."""
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST) + peer.data(1, b"m", end=True), 0.0)
    assert rec.streams[1].state is State.HALF_CLOSED_REMOTE
    core.receive(peer.headers(1, REQUEST), 0.0)
    assert kinds(sent(core)) == [("RstStreamFrame", 1, frames.STREAM_CLOSED)]
    assert rec.closes(1) == [("closed", 1, Exit.VIOLATION, frames.STREAM_CLOSED)]
    assert not core.streams
    core.receive(peer.data(1, b"late"), 0.0)  # in flight across the router's reset: ignored
    assert sent(core) == [] and not core.failed


@pytest.mark.parametrize(
    ("second", "code", "exit"),
    [
        ([(b"x-upper", b"a\r\nb")], frames.PROTOCOL_ERROR, Exit.MALFORMED),
        ([(b":path", b"/x")], frames.PROTOCOL_ERROR, Exit.MALFORMED),
        ([(b"connection", b"close")], frames.PROTOCOL_ERROR, Exit.MALFORMED),
        ([(b"te", b"gzip")], frames.PROTOCOL_ERROR, Exit.MALFORMED),
    ],
)
def test_malformed_trailers_reset_the_stream_and_never_reach_its_handler(
    second: list[tuple[bytes, bytes]], code: int, exit: Exit
) -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST) + peer.headers(1, second, end=True), 0.0)
    assert ("headers", 1, True) not in rec.events
    assert kinds(sent(core)) == [("RstStreamFrame", 1, code)]
    assert rec.closes(1) == [("closed", 1, exit, code)]


def test_a_second_header_block_that_does_not_end_the_stream_is_malformed() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST) + peer.headers(1, [(b"x-more", b"1")]), 0.0)
    assert rec.closes(1) == [("closed", 1, Exit.MALFORMED, frames.PROTOCOL_ERROR)]


@pytest.mark.parametrize(("body", "end_with_headers"), [(b"12345", False), (b"1", False), (b"", True)])
def test_a_body_that_disagrees_with_content_length_is_malformed(body: bytes, end_with_headers: bool) -> None:
    core, rec, peer = server()
    head = [*REQUEST, (b"content-length", b"3")]
    core.receive(peer.headers(1, head, end=end_with_headers), 0.0)
    if end_with_headers:  # refused before it was ever relayed
        assert rec.events == [("rejected",)]
    else:
        core.receive(peer.data(1, body, end=True), 0.0)
        assert ("data", 1, body, True) not in rec.events
        assert rec.closes(1) == [("closed", 1, Exit.MALFORMED, frames.PROTOCOL_ERROR)]
    assert kinds(sent(core))[-1] == ("RstStreamFrame", 1, frames.PROTOCOL_ERROR)


def test_every_stream_leaves_once_when_the_connection_fails_or_is_lost() -> None:
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST) + peer.headers(3, REQUEST), 0.0)
    core.receive(frames.header(7, frames.PING, 0, 0) + b"1234567", 0.0)  # 7 bytes: FRAME_SIZE_ERROR
    assert kinds(sent(core))[-1] == ("GoAwayFrame", 0, frames.FRAME_SIZE_ERROR)
    assert rec.failed
    assert rec.closes(1) == [("closed", 1, Exit.LOST, frames.FRAME_SIZE_ERROR)]
    assert rec.closes(3) == [("closed", 3, Exit.LOST, frames.FRAME_SIZE_ERROR)]
    core.lost()
    assert len(rec.closes(1)) == 1 and len(rec.closes(3)) == 1


def test_the_peers_goaway_refuses_the_streams_it_did_not_process() -> None:
    rec = Recorder()
    core = Connection(rec, client_side=True)
    core.initiate()
    core.receive(hf.SettingsFrame(0).serialize(), 0.0)
    one = core.open_stream(rec, REQUEST, True)
    three = core.open_stream(rec, REQUEST, True)
    core.receive(hf.GoAwayFrame(0, last_stream_id=1, error_code=0).serialize(), 0.0)
    assert rec.closes(three.sid) == [("closed", 3, Exit.REFUSED, frames.REFUSED_STREAM)]
    assert one.sid in core.streams


# -- closed streams: in flight, or an error --------------------------------------------------------


def test_a_late_headers_on_a_long_forgotten_reset_stream_is_a_stream_error_not_the_connection() -> None:
    core, rec, peer = server()
    count = 2 * rules.REMEMBERED_CLOSED_STREAMS + 1  # past twice the remembered: the oldest half goes
    for i in range(count):
        sid = 2 * i + 1
        core.receive(peer.headers(sid, REQUEST), float(i))
        core.reset(rec.streams[sid], frames.CANCEL)
    sent(core)
    core.receive(peer.headers(1, REQUEST), float(count))  # reset long ago
    assert kinds(sent(core)) == [("RstStreamFrame", 1, frames.STREAM_CLOSED)]
    core.receive(peer.headers(2 * (count - 1) + 1, REQUEST), float(count))  # reset just now: in flight
    assert sent(core) == [] and not core.failed


def test_a_skipped_stream_id_below_the_last_is_a_protocol_error() -> None:
    core, _rec, peer = server()
    core.receive(peer.headers(5, REQUEST, end=True) + peer.headers(3, REQUEST, end=True), 0.0)
    assert kinds(sent(core))[-1] == ("GoAwayFrame", 0, frames.PROTOCOL_ERROR)


@pytest.mark.parametrize(
    "frame",
    [hf.RstStreamFrame(9, error_code=8), hf.WindowUpdateFrame(9, window_increment=1), hf.DataFrame(9, data=b"x")],
)
def test_frames_on_an_idle_stream_are_a_protocol_error(frame: Any) -> None:
    core, _, _ = server()
    core.receive(frame.serialize(), 0.0)
    assert kinds(sent(core)) == [("GoAwayFrame", 0, frames.PROTOCOL_ERROR)]


# -- budgets and the output bound ------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        hf.PriorityFrame(1, depends_on=0, stream_weight=16),
        hf.WindowUpdateFrame(0, window_increment=1),
        hf.DataFrame(1),
        hf.SettingsFrame(0, flags=["ACK"]),
    ],
)
def test_frames_without_progress_are_cut_past_their_budget(frame: Any) -> None:
    core, _rec, peer = server()
    core.receive(peer.headers(1, REQUEST), 0.0)
    sent(core)
    one = frame.serialize()
    core.receive(one * (rules.IDLE_FRAMES[0] + rules.IDLE_FRAMES_PER_STREAM + 1), 0.0)
    assert kinds(sent(core))[-1] == ("GoAwayFrame", 0, frames.ENHANCE_YOUR_CALM)


def test_data_relayed_to_the_client_earns_its_window_updates() -> None:
    """A client that is sent data answers with WINDOW_UPDATEs: those are progress, never cut."""
    core, rec, peer = server()
    core.receive(peer.headers(1, REQUEST, end=True), 0.0)
    stream = rec.streams[1]
    update = (
        hf.WindowUpdateFrame(1, window_increment=1).serialize()
        + hf.WindowUpdateFrame(0, window_increment=1).serialize()
    )
    for _ in range(3 * rules.IDLE_FRAMES[0]):
        core.send_data(stream, b"t", False)
        core.receive(update, 0.0)
    assert not core.failed


def test_output_past_the_bound_while_the_transport_is_paused_fails_the_connection() -> None:
    """The bound is the core's (the listener gives client connections MAX_QUEUED_OUTPUT_BYTES): a
    small one here, answered PINGs one second apart (within their budget) to a client not reading."""
    core, _rec, _peer = server()
    core.output.max_backlog = 1000
    core.output.pause()
    ping = hf.PingFrame(0, opaque_data=b"12345678").serialize()
    for i in range(1000 // 17 + 1):
        core.receive(ping, float(i))  # one second apart: within the PING budget
        if core.failed:
            break
    assert core.failed
    assert kinds(sent(core)) == [("GoAwayFrame", 0, frames.ENHANCE_YOUR_CALM)]
