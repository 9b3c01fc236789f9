"""The WebSocket decisions: the handshake verdict, the Accept check, Close frames, the frame tracker."""

from __future__ import annotations

import base64
import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drain_router.decisions import websocket as ws

KEY = base64.b64encode(bytes(range(16)))
GOOD = [
    (b"Host", b"m"),
    (b"Connection", b"Upgrade"),
    (b"Upgrade", b"websocket"),
    (b"Sec-WebSocket-Key", KEY),
    (b"Sec-WebSocket-Version", b"13"),
]


def _without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in GOOD if n != name]


@pytest.mark.parametrize(
    ("method", "version", "headers", "verdict"),
    [
        (b"GET", (1, 1), GOOD, None),
        (b"GET", (1, 1), [*_without(b"Connection"), (b"Connection", b"keep-alive, Upgrade")], None),
        (b"GET", (1, 1), [*_without(b"Upgrade"), (b"Upgrade", b"WebSocket")], None),
        (b"GET", (1, 1), [*_without(b"Upgrade"), (b"Upgrade", b"h2c")], ws.NOT_WEBSOCKET),
        (b"GET", (1, 1), [*_without(b"Upgrade"), (b"Upgrade", b"websocket, h2c")], ws.NOT_WEBSOCKET),
        (b"POST", (1, 1), GOOD, ws.BAD_HANDSHAKE),
        (b"GET", (1, 0), GOOD, ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), _without(b"Sec-WebSocket-Key"), ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), [*GOOD, (b"Sec-WebSocket-Key", KEY)], ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), [*_without(b"Sec-WebSocket-Key"), (b"Sec-WebSocket-Key", b"short")], ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), [*_without(b"Sec-WebSocket-Key"), (b"Sec-WebSocket-Key", b"!!!!")], ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), _without(b"Sec-WebSocket-Version"), ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), [*_without(b"Sec-WebSocket-Version"), (b"Sec-WebSocket-Version", b"8")], ws.BAD_HANDSHAKE),
        (b"GET", (1, 1), _without(b"Connection"), ws.BAD_HANDSHAKE),
    ],
)
def test_handshake_verdict(
    method: bytes, version: tuple[int, int], headers: list[tuple[bytes, bytes]], verdict: str | None
) -> None:
    assert ws.handshake(method, version, headers) == verdict


def test_accept_is_rfc6455_example() -> None:
    # RFC 6455 §1.3's worked example.
    assert ws.accept_for(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ([(b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", ws.accept_for(KEY))], True),
        ([(b"Upgrade", b"websocket")], False),
        ([(b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", ws.accept_for(b"other"))], False),
        ([(b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", ws.accept_for(KEY))] * 2, False),
        ([(b"Upgrade", b"h2c"), (b"Sec-WebSocket-Accept", ws.accept_for(KEY))], False),
    ],
)
def test_accept_matches(headers: list[tuple[bytes, bytes]], ok: bool) -> None:
    assert ws.accept_matches(KEY, headers) is ok


def test_close_frames() -> None:
    assert ws.close_frame(1001) == b"\x88\x02\x03\xe9"
    masked = ws.close_frame(1001, b"\x01\x02\x03\x04")
    assert masked[:6] == b"\x88\x82\x01\x02\x03\x04"
    assert bytes([masked[6] ^ 1, masked[7] ^ 2]) == b"\x03\xe9"


def frame(opcode: int, payload_len: int, *, fin: bool = True, mask: bool = False, wide: int | None = None) -> bytes:
    """A frame with a payload (0xff bytes) of ``payload_len``; ``wide`` forces the 16/64-bit length form."""
    first = (0x80 if fin else 0) | opcode
    form = wide or (7 if payload_len < 126 else 16 if payload_len < 65536 else 64)
    m = 0x80 if mask else 0
    if form == 7:
        head = bytes([first, m | payload_len])
    elif form == 16:
        head = bytes([first, m | 126]) + struct.pack("!H", payload_len)
    else:
        head = bytes([first, m | 127]) + struct.pack("!Q", payload_len)
    return head + (b"\xaa\xbb\xcc\xdd" if mask else b"") + b"\xff" * payload_len


@pytest.mark.parametrize(
    ("stream", "boundary", "closed"),
    [
        (b"", True, False),
        (frame(1, 5), True, False),
        (frame(1, 5)[:1], False, False),
        (frame(1, 5)[:-1], False, False),
        (frame(2, 300), True, False),
        (frame(2, 300)[:3], False, False),
        (frame(2, 70000), True, False),
        (frame(2, 70000)[:9], False, False),
        (frame(2, 5, wide=64), True, False),
        (frame(2, 0, mask=True), True, False),
        (frame(2, 0, mask=True)[:5], False, False),
        (frame(1, 3, fin=False) + frame(9, 2) + frame(0, 4), True, False),
        (frame(1, 3, fin=False) + frame(9, 2), True, False),
        (frame(1, 3, fin=False) + frame(9, 2)[:3], False, False),
        (frame(8, 2), True, True),
    ],
)
def test_tracker_table(stream: bytes, boundary: bool, closed: bool) -> None:
    tracker = ws.FrameTracker()
    tracker.feed(stream)
    assert (tracker.at_boundary, tracker.closed, tracker.error) == (boundary, closed, False)


def test_tracker_refuses_a_length_with_its_msb_set() -> None:
    tracker = ws.FrameTracker()
    tracker.feed(bytes([0x82, 0x7F]) + struct.pack("!Q", 1 << 63))
    assert tracker.error and not tracker.at_boundary
    tracker.feed(bytes(100))  # stopped: nothing more is followed
    assert tracker.error


frames = st.lists(
    st.builds(
        frame,
        st.sampled_from([0, 1, 2, 8, 9, 10]),
        st.integers(0, 70000),
        fin=st.booleans(),
        mask=st.booleans(),
    ),
    max_size=6,
)


@settings(deadline=None)  # one draw per byte in places: slow on a busy machine, not wrong
@given(frames, st.data())
def test_tracker_any_chunking(parts: list[bytes], data: st.DataObject) -> None:
    """Fed in arbitrary chunks, the tracker is at a boundary exactly at the ends of frames."""
    stream = b"".join(parts)
    ends = set()
    offset = 0
    for part in parts:
        offset += len(part)
        ends.add(offset)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)), max_size=12)) | ends | {0, len(stream)})
    tracker = ws.FrameTracker()
    for start, stop in itertools.pairwise(cuts):
        tracker.feed(stream[start:stop])
        assert tracker.at_boundary is (stop in ends), stop
    assert not tracker.error


@settings(deadline=None)  # one draw per byte in places: slow on a busy machine, not wrong
@given(frames, st.data())
def test_feed_to_boundary_stops_exactly_at_the_next_frame_end(parts: list[bytes], data: st.DataObject) -> None:
    """From anywhere in a stream, :meth:`feed_to_boundary` takes up to the next frame end and no
    further (where a Close 1001 can be slipped in), or the whole chunk when no frame ends in it."""
    stream = b"".join(parts)
    ends = sorted(set(itertools.accumulate(len(p) for p in parts)))
    tracker = ws.FrameTracker()
    pos = 0
    while pos < len(stream):
        stop = data.draw(st.integers(pos + 1, len(stream)))
        if tracker.at_boundary:
            assert tracker.feed_to_boundary(stream[pos:stop]) == 0
            tracker.feed(stream[pos : pos + 1])
            pos += 1
            continue
        taken = tracker.feed_to_boundary(stream[pos:stop])
        after = min(e for e in ends if e > pos)
        assert taken == min(after, stop) - pos
        assert tracker.at_boundary is (after <= stop)
        pos += taken
