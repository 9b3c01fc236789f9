"""HPACK for one connection, each way, with the blocks it has seen remembered. Pure: no I/O.

HPACK in Python costs 10-50 µs a block, and a gRPC call's blocks repeat (the same method, the same
response head, ``grpc-status: 0``): a block that left the dynamic table as it was (indexed fields,
literals not indexed) decodes the same way until a block changes the table, so its list is
remembered until then; the same holds for encoding.
"""

from __future__ import annotations

from typing import Any, Final, cast

import hpack

from drain_router.h2 import rules as r

Headers = list[tuple[bytes, bytes]]

#: Header blocks and header lists a connection remembers, each way, and the largest block
#: remembered: at most 64 KiB per connection and direction.
CACHE_ENTRIES: Final = 64
CACHE_BLOCK_BYTES: Final = 1024


class CompressionError(Exception):
    """A header block HPACK cannot decode (COMPRESSION_ERROR, RFC 9113 §4.3)."""


class HeaderListTooLarge(Exception):
    """A decoded header list past SETTINGS_MAX_HEADER_LIST_SIZE."""


def table_mark(table: Any) -> tuple[int, object]:
    """What changes whenever an HPACK dynamic table does: an entry is always added in front (a new
    object), and an eviction without an addition shortens it."""
    entries = table.dynamic_entries
    return len(entries), (entries[0] if entries else None)


def remember(cache: dict[Any, Any], key: Any, value: Any, block: bytes, before: tuple[int, object], table: Any) -> None:
    """Remember ``value`` when the block left the HPACK table as it was (``before``: its
    :func:`table_mark` then); a block that changed the table moves its indexes, so everything
    remembered is forgotten then."""
    after = table_mark(table)
    if before[0] != after[0] or before[1] is not after[1]:
        cache.clear()
    elif len(cache) < CACHE_ENTRIES and len(block) <= CACHE_BLOCK_BYTES:
        cache[key] = value


class Decoder:
    __slots__ = ("decoded", "decoder")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=r.MAX_HEADER_LIST_BYTES)
        self.decoder.max_allowed_table_size = r.HEADER_TABLE_BYTES
        self.decoded: dict[bytes, Headers] = {}

    def decode(self, block: bytes) -> Headers:
        """A header block's list. The list is shared: nobody changes a header list after decoding.
        Raises :class:`CompressionError` or :class:`HeaderListTooLarge`."""
        headers = self.decoded.get(block)
        if headers is not None:
            return headers
        table = self.decoder.header_table
        before = table_mark(table)
        try:
            # raw=True: (bytes, bytes) pairs, as HeaderTuple (a tuple subclass).
            headers = cast(Headers, list(self.decoder.decode(block, raw=True)))
        except hpack.OversizedHeaderListError:
            raise HeaderListTooLarge from None
        except (hpack.HPACKError, IndexError, ValueError):
            raise CompressionError from None
        remember(self.decoded, block, headers, block, before, table)
        return headers


class Encoder:
    __slots__ = ("encoded", "encoder")

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.encoded: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}

    def encode(self, headers: Headers) -> bytes:
        """A header list's block, remembered the same way. Not Huffman-coded: the router's peers are
        on the same node or network, where the CPU costs more than bytes."""
        key = tuple(headers)
        block = self.encoded.get(key)
        if block is None:
            table = self.encoder.header_table
            before = table_mark(table)
            block = self.encoder.encode(headers, huffman=False)
            remember(self.encoded, key, block, block, before, table)
        return block

    def resize(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the next block carries the size update."""
        self.encoder.header_table_size = min(size, r.HEADER_TABLE_BYTES)
        self.encoded.clear()
