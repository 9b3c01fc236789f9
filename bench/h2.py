"""The least HTTP/2 (RFC 9113) the bench's gRPC upstream and gRPC load generator need: frame headers,
splitting a read into frames, SETTINGS, WINDOW_UPDATE, HPACK blocks that never touch a dynamic table,
and counting gRPC messages across DATA payloads.

Kept apart from the router's own framing (``drain_router.h2.frames``) on purpose: the tool
that measures the router does not share its code.
"""

from __future__ import annotations

import struct
from typing import Final

import hpack
import hpack.table
from hpack.huffman_table import decode_huffman

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA: Final = 0x0
HEADERS: Final = 0x1
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY: Final = 0x20

CANCEL: Final = 0x8

SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5

DEFAULT_WINDOW: Final = 65_535
MAX_FRAME: Final = 16_384

_HEADER: Final = struct.Struct(">IBI")
_SETTING: Final = struct.Struct(">HI")

Headers = list[tuple[bytes, bytes]]
Frame = tuple[int, int, int, bytes]

_STATIC: Final = hpack.table.HeaderTable.STATIC_TABLE  # index i is _STATIC[i - 1]


def header(length: int, kind: int, flags: int, sid: int) -> bytes:
    return _HEADER.pack((length << 8) | kind, flags, sid)


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack((len(payload) << 8) | kind, flags, sid) + payload


def settings(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in pairs.items()))


def parse_settings(payload: bytes) -> dict[int, int]:
    return dict(_SETTING.unpack_from(payload, i) for i in range(0, len(payload) - len(payload) % 6, 6))


def window_update(sid: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, increment.to_bytes(4, "big"))


def split(buffer: bytearray) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``buffer``, and how many bytes they took."""
    found: list[Frame] = []
    pos, size = 0, len(buffer)
    unpack = _HEADER.unpack_from
    while size - pos >= 9:
        word, flags, sid = unpack(buffer, pos)
        end = pos + 9 + (word >> 8)
        if end > size:
            break
        found.append((word & 0xFF, flags, sid & 0x7FFFFFFF, bytes(buffer[pos + 9 : end])))
        pos = end
    return found, pos


def data_of(flags: int, payload: bytes) -> bytes:
    """A DATA frame's data without its padding."""
    if flags & PADDED:
        return payload[1 : len(payload) - payload[0]]
    return payload


def header_block(flags: int, payload: bytes) -> bytes:
    """A HEADERS frame's header block fragment without padding and priority."""
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, end - payload[0]
    if flags & PRIORITY:
        start += 5
    return payload[start:end]


def static_block(headers: Headers) -> bytes:
    """A header block that refers to the static table at most and adds nothing to the dynamic one
    (literals never indexed): the same bytes are valid on every connection, so they are built once."""
    fields = [hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers]
    block: bytes = hpack.Encoder().encode(fields, huffman=False)
    return block


class Decoder:
    """HPACK decoding with a cache: a block whose decoding left the dynamic table as it was (indexed
    fields and literals that are not indexed: what clients send for the same request again, and
    what nginx sends upstream) decodes the same until a block that changes the table comes."""

    def __init__(self) -> None:
        self.hpack = hpack.Decoder()
        self.cache: dict[bytes, Headers] = {}

    def _table(self) -> tuple[int, int, int]:
        table = self.hpack.header_table
        entries = table.dynamic_entries
        return (id(entries[0]) if entries else 0, len(entries), table.maxsize)

    def decode(self, block: bytes) -> Headers:
        hit = self.cache.get(block)
        if hit is not None:
            return hit
        before = self._table()
        headers = [(bytes(n), bytes(v)) for n, v in self.hpack.decode(block, raw=True)]
        if self._table() == before:
            self.cache[block] = headers
        else:
            self.cache.clear()
        return headers


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 §5.1) at ``pos`` with an N-bit prefix; (value, next position)."""
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


class _Dynamic(Exception):
    """The block uses or changes the dynamic table: decode it whole."""


class Picker(Decoder):
    """For a server that needs a few request headers only (the bench upstream: ``:path`` and its
    pacing metadata). It advertises SETTINGS_HEADER_TABLE_SIZE 0; once the client has acknowledged
    that (:meth:`table_gone`), no header block can use a dynamic table, so :meth:`pick` reads the
    wanted fields out of a block without decoding the rest (Huffman-coded names and values of other
    fields are skipped). Before that, a block that uses the table is decoded whole, which keeps the
    table right."""

    def __init__(self) -> None:
        super().__init__()
        self.strings: dict[bytes, bytes] = {}
        self.picked: dict[bytes, dict[bytes, bytes]] = {}
        """Without a table a block reads the same every time: what was picked from each, by block."""
        self.no_table = False

    def table_gone(self) -> None:
        """The client acknowledged SETTINGS_HEADER_TABLE_SIZE 0: entries it adds are evicted at once
        (RFC 7541 §4.4), and it may refer to none."""
        self.no_table = True
        self.hpack.header_table_size = 0

    def pick(self, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes]:
        """The ``wanted`` fields of ``block`` (the same ``wanted`` on every call)."""
        if self.no_table:
            found = self.picked.get(block)
            if found is None:
                if len(self.picked) > 1024:
                    self.picked.clear()
                found = self.picked[block] = self._pick(block, wanted)
            return found
        try:
            return self._pick(block, wanted)
        except _Dynamic:
            return {n: v for n, v in self.decode(block) if n in wanted}

    def _string(self, block: bytes, pos: int, keep: bool) -> tuple[bytes, int]:
        huffman = block[pos] & 0x80
        length, pos = _integer(block, pos, 7)
        end = pos + length
        if not keep:
            return b"", end
        raw = block[pos:end]
        if not huffman:
            return raw, end
        text = self.strings.get(raw)
        if text is None:
            if len(self.strings) > 256:
                self.strings.clear()
            text = self.strings[raw] = decode_huffman(raw)
        return text, end

    def _pick(self, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        pos, size = 0, len(block)
        while pos < size:
            first = block[pos]
            if first & 0x80:  # indexed field
                index, pos = _integer(block, pos, 7)
                if not 0 < index <= len(_STATIC):
                    raise _Dynamic
                name, value = _STATIC[index - 1]
                if name in wanted:
                    found[name] = value
                continue
            if first & 0xE0 == 0x20:  # a table size update
                if not self.no_table:
                    raise _Dynamic
                _, pos = _integer(block, pos, 5)
                continue
            if first & 0x40:  # a literal with incremental indexing: evicted at once without a table
                if not self.no_table:
                    raise _Dynamic
                index, pos = _integer(block, pos, 6)
            else:  # a literal not indexed, or never indexed
                index, pos = _integer(block, pos, 4)
            if index > len(_STATIC):
                raise _Dynamic
            if index:
                name = _STATIC[index - 1][0]
            else:
                name, pos = self._string(block, pos, True)
            value, pos = self._string(block, pos, name in wanted)
            if name in wanted:
                found[name] = value
        return found


def grpc_message(payload: bytes) -> bytes:
    """One uncompressed gRPC message: the 5-byte prefix, then the payload."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class MessageCounter:
    """Counts the gRPC messages of one stream as its DATA arrives, whatever the framing (a proxy may
    join several messages in one DATA frame, or split one across several)."""

    __slots__ = ("head", "skip")

    def __init__(self) -> None:
        self.skip = 0
        """Bytes of the current message's payload still to come."""
        self.head = b""
        """A message prefix (fewer than 5 bytes) split across DATA frames."""

    def feed(self, data: bytes) -> int:
        """The messages that ``data`` completes."""
        count, pos, size = 0, 0, len(data)
        if self.skip:
            take = min(self.skip, size)
            self.skip -= take
            pos = take
            if self.skip:
                return 0
            count += 1  # (a split prefix and a payload still to come never coexist)
        if self.head:
            data = self.head + data[pos:]
            pos, size = 0, len(data)
            self.head = b""
        while pos < size:
            if size - pos < 5:
                self.head = data[pos:]
                return count
            length = int.from_bytes(data[pos + 1 : pos + 5], "big")
            pos += 5 + length
            if pos > size:
                self.skip = pos - size
                return count
            count += 1
        return count
