"""HTTP/2 frames (RFC 9113 §4, §6): their numbers, building the ones the router sends, and splitting a
read into frames. Pure: no I/O.

Frames are handled as ``(type, flags, stream_id, payload)``; a DATA frame relayed unchanged keeps its
payload bytes and gets a new 9-byte header (:func:`data_header`), so a message passes through
without being copied into a new structure.
"""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (§6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Error codes (§7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
SETTINGS_TIMEOUT: Final = 0x4
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

# Settings (§6.5.2).
HEADER_TABLE_SIZE: Final = 0x1
ENABLE_PUSH: Final = 0x2
MAX_CONCURRENT_STREAMS: Final = 0x3
INITIAL_WINDOW_SIZE: Final = 0x4
MAX_FRAME_SIZE: Final = 0x5
MAX_HEADER_LIST_SIZE: Final = 0x6

DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_FRAME_CEILING: Final = 16_777_215
MAX_WINDOW: Final = 2**31 - 1
MAX_STREAM_ID: Final = 2**31 - 1

_HEADER = struct.Struct(">IBI")  # (length << 8 | type) as 4 bytes, then flags, then stream id


class FrameSizeError(Exception):
    """A frame longer than the receiver's SETTINGS_MAX_FRAME_SIZE (a connection error, §4.2)."""


class H2Error(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """The 9-byte frame header."""
    return _HEADER.pack((length << 8) | kind, flags, stream_id)


def data_header(length: int, stream_id: int, end_stream: bool) -> bytes:
    return header(length, DATA, END_STREAM if end_stream else 0, stream_id)


def settings(pairs: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack(">HI", key, value) for key, value in pairs.items())
    return header(len(payload), SETTINGS, 0, 0) + payload


SETTINGS_ACK: Final = header(0, SETTINGS, ACK, 0)


def ping(opaque: bytes, *, ack: bool = False) -> bytes:
    return header(8, PING, ACK if ack else 0, 0) + opaque


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return header(8 + len(debug), GOAWAY, 0, 0) + struct.pack(">II", last_stream_id, code) + debug


def rst_stream(stream_id: int, code: int) -> bytes:
    return header(4, RST_STREAM, 0, stream_id) + code.to_bytes(4, "big")


def window_update(stream_id: int, increment: int) -> bytes:
    return header(4, WINDOW_UPDATE, 0, stream_id) + increment.to_bytes(4, "big")


def headers(stream_id: int, block: bytes, *, end_stream: bool, max_frame: int) -> bytes:
    """A header block as HEADERS plus as many CONTINUATION frames as the peer's frame size needs."""
    end = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return header(len(block), HEADERS, end | END_HEADERS, stream_id) + block
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [header(len(parts[0]), HEADERS, end, stream_id), parts[0]]
    for i, part in enumerate(parts[1:], 1):
        out += [header(len(part), CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, stream_id), part]
    return b"".join(out)


Frame = tuple[int, int, int, bytes]
"""``(type, flags, stream_id, payload)``."""


def split(buffer: bytearray, max_frame: int) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``buffer`` and how many bytes they take; an incomplete frame
    at the end waits for the next read. Raises :class:`FrameSizeError` for a frame over ``max_frame``
    as soon as its header is read, before its payload is buffered."""
    frames: list[Frame] = []
    pos = 0
    size = len(buffer)
    unpack = _HEADER.unpack_from
    while size - pos >= 9:
        length_type, flags, stream_id = unpack(buffer, pos)
        length = length_type >> 8
        if length > max_frame:
            raise FrameSizeError(length)
        end = pos + 9 + length
        if end > size:
            break
        frames.append((length_type & 0xFF, flags, stream_id & 0x7FFFFFFF, bytes(buffer[pos + 9 : end])))
        pos = end
    return frames, pos


def coalesce(found: list[Frame], max_frame: int) -> list[Frame]:
    """Consecutive DATA frames of one stream merged into one, up to ``max_frame`` bytes and never
    past an END_STREAM (which the merged frame then carries): a model server that writes one token
    per frame hands the router many per read, and the router relays them as one frame. Padded
    frames are left as they are, and so are empty ones that do not end their stream (each is paid
    for from the connection's budget). The bytes and their order do not change, so neither does what
    flow control counts."""
    out: list[Frame] = []
    for frame in found:
        kind, flags, sid, payload = frame
        if kind == DATA and not flags & PADDED and (payload or flags & END_STREAM) and out:
            last_kind, last_flags, last_sid, last_payload = out[-1]
            if (
                last_kind == DATA
                and last_sid == sid
                and not last_flags & (PADDED | END_STREAM)
                and len(last_payload) + len(payload) <= max_frame
            ):
                out[-1] = (DATA, flags, sid, last_payload + payload)
                continue
        out.append(frame)
    return out


def strip_padding(flags: int, payload: bytes) -> bytes | None:
    """A DATA or HEADERS payload without its padding (§6.1); None when the padding is longer than the
    payload (a PROTOCOL_ERROR)."""
    if not flags & PADDED:
        return payload
    if not payload:
        return None
    pad = payload[0]
    if pad >= len(payload):
        return None
    return payload[1 : len(payload) - pad]


def parse_settings(payload: bytes) -> dict[int, int] | None:
    """A SETTINGS payload as {id: value}; None when its length is not a multiple of 6."""
    if len(payload) % 6:
        return None
    return {key: value for key, value in struct.iter_unpack(">HI", payload)}
