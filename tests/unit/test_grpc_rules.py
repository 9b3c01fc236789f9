"""The gRPC listener's pure parts, by table: what a request, response and trailer section may
carry (RFC 9113 §8), grpc-timeout, the rate budget, the frames the router builds, the health
messages (checked against the real protobuf and hyperframe)."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2
from hyperframe import frame as hf

from drain_router.grpc import answers, health
from drain_router.h2 import frames, rules

GOOD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a.B/C"), (b":authority", b"x")]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        (GOOD, None),
        ([*GOOD, (b"te", b"trailers"), (b"grpc-timeout", b"5S")], None),
        ([*GOOD, (b"X-Upper", b"1")], "invalid field name"),
        ([*GOOD, (b"connection", b"close")], "connection-specific"),
        ([*GOOD, (b"transfer-encoding", b"chunked")], "connection-specific"),
        ([*GOOD, (b"te", b"gzip")], "te other than trailers"),
        ([*GOOD, (b"x", b"a\r\nb")], "invalid value"),
        ([*GOOD, (b"x", b" lead")], "invalid value"),
        ([*GOOD, (b"x", b"a\x00")], "invalid value"),
        ([(b"x", b"1"), *GOOD], "pseudo-header after"),
        ([*GOOD, (b":method", b"GET")], "repeated :method"),
        ([*GOOD, (b"x", b"1"), (b":method", b"GET")], "pseudo-header after"),
        ([*GOOD[:1], *GOOD], "repeated :method"),
        ([(b":protocol", b"websocket"), *GOOD], "unknown pseudo-header"),
        (GOOD[1:], "missing or invalid :method"),
        ([GOOD[0], GOOD[2], GOOD[3]], "missing or invalid :scheme"),
        ([GOOD[0], (b":scheme", b"ht tp"), *GOOD[2:]], "missing or invalid :scheme"),
        ([GOOD[0], (b":scheme", b"http\r\n"), *GOOD[2:]], "missing or invalid :scheme"),
        ([*GOOD[:3], (b":authority", b"a b")], "invalid :authority"),
        ([*GOOD[:3], (b":authority", b"a\r\nx: y")], "invalid :authority"),
        ([*GOOD[:3], (b":authority", b"a\x00")], "invalid :authority"),
        ([*GOOD[:3], (b":authority", b"")], "invalid :authority"),
        ([*GOOD, (b"host", b"other")], "host differs from :authority"),
        ([*GOOD, (b"host", b"x")], None),
        ([*GOOD, (b"content-length", b"5"), (b"content-length", b"6")], "content-length given twice"),
        ([*GOOD[:2], GOOD[3]], "missing or invalid :path"),
        ([(b":method", b"CONNECT"), *GOOD[1:]], "CONNECT"),
        ([*GOOD, (b"content-length", b"x1")], "content-length"),
    ],
)
def test_request_headers(headers: list[tuple[bytes, bytes]], error: str | None) -> None:
    """A malformed request head is refused before it is relayed (RFC 9113 §8.2-8.3)."""
    if error is None:
        request = rules.request(headers)
        assert (request.path, request.length) == (b"/a.B/C", -1)
    else:
        with pytest.raises(rules.Malformed, match=error):
            rules.request(headers)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(b":status", b"200"), (b"content-type", b"application/grpc")], 200),
        ([(b":status", b"103")], 103),
        ([(b"content-type", b"application/grpc"), (b":status", b"200")], None),
        ([(b":status", b"2000")], None),
        ([(b":status", b"200"), (b":path", b"/")], None),
        ([(b":status", b"200"), (b"Grpc-Status", b"0")], None),
        ([], None),
    ],
)
def test_response_heads(headers: list[tuple[bytes, bytes]], status: int | None) -> None:
    if status is None:
        with pytest.raises(rules.Malformed):
            rules.response(headers)
    else:
        assert rules.response(headers) == (status, -1)


def test_trailers_carry_no_pseudo_headers() -> None:
    rules.trailers([(b"grpc-status", b"0"), (b"x-custom", b"1")])
    with pytest.raises(rules.Malformed):
        rules.trailers([(b":status", b"200")])


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"5S", 5.0),
        (b"100m", 0.1),
        (b"2H", 7200.0),
        (b"3M", 180.0),
        (b"7u", 7e-6),
        (b"9n", 9e-9),
        (b"123456789S", None),
        (b"5s", None),
        (b"S", None),
        (b"-1S", None),
    ],
)
def test_grpc_timeout(value: bytes, seconds: float | None) -> None:
    request = rules.request([*GOOD, (b"grpc-timeout", value)])
    assert request.timeout == (pytest.approx(seconds) if seconds else None)


def test_grpc_status_and_kind() -> None:
    assert rules.grpc_status([(b"grpc-status", b"14"), (b"grpc-message", b"x")]) == "14"
    assert rules.grpc_status([(b"grpc-status", b"x")]) is None
    assert rules.request([*GOOD, (b"content-type", b"application/grpc+proto")]).grpc
    assert not rules.request([*GOOD, (b"content-type", b"application/json")]).grpc


def test_budget_allows_its_burst_then_its_rate() -> None:
    budget = rules.Budget((3, 2.0), now=0.0)
    assert [budget.spend(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.spend(0.5)  # one token back after half a second at 2/s
    assert not budget.spend(0.5)
    assert [budget.spend(100.0) for _ in range(4)] == [True, True, True, False]  # never past the burst


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (frames.goaway(2**31 - 1, frames.NO_ERROR), ("GoAwayFrame", 2**31 - 1, 0)),
        (frames.goaway(7, frames.ENHANCE_YOUR_CALM, b"why"), ("GoAwayFrame", 7, 11)),
        (frames.rst_stream(5, frames.REFUSED_STREAM), ("RstStreamFrame", 5, 7)),
    ],
)
def test_control_frames_parse_with_hyperframe(built: bytes, expected: tuple[str, int, int]) -> None:
    frame, length = hf.Frame.parse_frame_header(memoryview(built[:9]))
    frame.parse_body(memoryview(built[9 : 9 + length]))
    if isinstance(frame, hf.GoAwayFrame):
        assert (type(frame).__name__, frame.last_stream_id, frame.error_code) == expected
    else:
        assert (type(frame).__name__, frame.stream_id, frame.error_code) == expected


def test_a_large_header_block_is_split_into_continuations() -> None:
    built = frames.headers(3, b"h" * 40_000, end_stream=True, max_frame=16_384)
    found, used = frames.split(bytearray(built), 16_384)
    assert used == len(built)
    assert [(kind, flags) for kind, flags, _, _ in found] == [
        (frames.HEADERS, frames.END_STREAM),
        (frames.CONTINUATION, 0),
        (frames.CONTINUATION, frames.END_HEADERS),
    ]
    assert b"".join(payload for *_, payload in found) == b"h" * 40_000


def test_split_waits_for_a_whole_frame_and_refuses_an_oversized_one() -> None:
    built = frames.data_header(10, 1, False) + b"0123456789"
    assert frames.split(bytearray(built[:15]), 16_384) == ([], 0)
    with pytest.raises(frames.FrameSizeError):
        frames.split(bytearray(frames.data_header(20_000, 1, False)), 16_384)


@pytest.mark.parametrize(
    ("flags", "payload", "stripped"),
    [(0, b"abc", b"abc"), (frames.PADDED, b"\x02abcXX", b"abc"), (frames.PADDED, b"\x09abc", None)],
)
def test_padding(flags: int, payload: bytes, stripped: bytes | None) -> None:
    assert frames.strip_padding(flags, payload) == stripped


@pytest.mark.parametrize("status", [health.SERVING, health.NOT_SERVING])
def test_health_messages_decode_with_protobuf(status: int) -> None:
    framed = health.message(status)
    assert framed[0] == 0 and int.from_bytes(framed[1:5], "big") == len(framed) - 5
    assert health_pb2.HealthCheckResponse.FromString(framed[5:]).status == status


def test_grpc_message_is_percent_encoded() -> None:
    assert answers.percent_encode("drain 100% — retry") == b"drain 100%25 %E2%80%94 retry"


D, H, E, P = frames.DATA, frames.HEADERS, frames.END_STREAM, frames.PADDED


@pytest.mark.parametrize(
    ("found", "merged"),
    [
        ([(D, 0, 1, b"a"), (D, 0, 1, b"b"), (D, E, 1, b"c")], [(D, E, 1, b"abc")]),
        ([(D, E, 1, b"a"), (D, 0, 1, b"b")], [(D, E, 1, b"a"), (D, 0, 1, b"b")]),  # never past an end
        ([(D, 0, 1, b"a"), (D, 0, 3, b"b"), (D, 0, 1, b"c")], [(D, 0, 1, b"a"), (D, 0, 3, b"b"), (D, 0, 1, b"c")]),
        ([(D, 0, 1, b"a"), (H, 4, 1, b"h"), (D, 0, 1, b"b")], [(D, 0, 1, b"a"), (H, 4, 1, b"h"), (D, 0, 1, b"b")]),
        ([(D, 0, 1, b"a"), (D, P, 1, b"\x00b")], [(D, 0, 1, b"a"), (D, P, 1, b"\x00b")]),  # padding kept apart
        ([(D, 0, 1, b"a" * 10), (D, 0, 1, b"b" * 7)], [(D, 0, 1, b"a" * 10), (D, 0, 1, b"b" * 7)]),  # past 16
        ([(D, 0, 1, b"a" * 10), (D, 0, 1, b"b" * 6)], [(D, 0, 1, b"a" * 10 + b"b" * 6)]),
    ],
)
def test_data_frames_of_one_stream_are_merged(found: list[frames.Frame], merged: list[frames.Frame]) -> None:
    assert frames.coalesce(found, 16) == merged


def test_content_length_is_returned_with_the_path() -> None:
    assert rules.request([*GOOD, (b"content-length", b"12")]).length == 12
    assert rules.response([(b":status", b"200"), (b"content-length", b"0")]) == (200, 0)


@pytest.mark.parametrize(
    ("status", "length", "head", "owed"),
    [
        (200, 12, False, 12),  # content: exactly its content-length
        (200, -1, False, -1),  # no content-length: no check
        (200, 0, False, 0),
        (404, 9, False, 9),
        (200, 12, True, 0),  # the answer to HEAD: no content, whatever its content-length says
        (200, -1, True, 0),
        (404, 9, True, 0),
        (204, 12, False, 0),  # 204 and 304: no content (RFC 9110 §6.4.1)
        (204, -1, False, 0),
        (304, 12, False, 0),
        (304, -1, True, 0),
        (205, 3, False, 3),  # a 205 has none by its meaning, but any content must match (RFC 9110 §15.3.6)
        (206, 3, False, 3),
    ],
)
def test_content_a_response_owes(status: int, length: int, head: bool, owed: int) -> None:
    assert rules.content_owed(status, length, head) == owed


@pytest.mark.parametrize(
    ("headers", "head"),
    [
        ([(b":method", b"HEAD"), *GOOD[1:]], True),
        ([(b":scheme", b"http"), (b":path", b"/"), (b":method", b"HEAD")], True),
        (GOOD, False),
        ([(b":method", b"GET"), *GOOD[1:]], False),
        ([(b":method", b"head"), *GOOD[1:]], False),  # methods are case-sensitive (RFC 9110 §9.1)
        ([*GOOD[1:], (b"x-method", b"HEAD")], False),
        ([(b"x", b"1"), (b":method", b"HEAD")], False),  # a pseudo-header after a field is not one
        ([], False),
    ],
)
def test_a_head_request_is_known_by_its_method(headers: list[tuple[bytes, bytes]], head: bool) -> None:
    assert rules.asks_head(headers) is head


def test_a_budget_earns_from_a_running_total() -> None:
    """Tokens earned by progress come back on top of the time refill, never past the burst."""
    budget = rules.Budget((2, 0.0), now=0.0)
    assert budget.spend(0.0) and budget.spend(0.0)
    assert not budget.spend(0.0)
    assert budget.spend(0.0, earned=1)  # one earned
    assert not budget.spend(0.0, earned=1)  # the same total: nothing new
    assert budget.spend(0.0, earned=100) and budget.spend(0.0, earned=100)  # capped at the burst
    assert not budget.spend(0.0, earned=100)
