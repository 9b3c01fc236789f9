"""A connection's remembered HPACK blocks (drain_router.h2.hpackcache): a remembered answer
is used only while the dynamic table is as it was; checked against hpack's own decoder and encoder."""

from __future__ import annotations

import hpack

from drain_router.h2.hpackcache import Decoder, Encoder


def test_a_remembered_list_is_forgotten_when_the_table_shifts() -> None:
    conn = Decoder()
    peer = hpack.Encoder()
    first = peer.encode([(b"x-a", b"1")])  # a literal: entry 62 is now x-a
    assert conn.decode(first) == [(b"x-a", b"1")]
    again = peer.encode([(b"x-a", b"1")])  # one indexed byte: 0xBE (index 62)
    assert again == b"\xbe"
    assert conn.decode(again) == [(b"x-a", b"1")]
    assert conn.decoded == {b"\xbe": [(b"x-a", b"1")]}
    conn.decode(peer.encode([(b"x-b", b"2")]))  # a new entry: index 62 is x-b now
    assert conn.decoded == {}
    assert conn.decode(b"\xbe") == [(b"x-b", b"2")]


def test_a_remembered_block_is_what_the_encoder_would_write() -> None:
    conn = Encoder()
    reader = hpack.Decoder()
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    for _ in range(3):
        assert [tuple(h) for h in reader.decode(conn.encode(headers), raw=True)] == headers
    assert len(conn.encoded) == 1
    other = [(b"grpc-status", b"0"), (b"x-new", b"v")]
    assert [tuple(h) for h in reader.decode(conn.encode(other), raw=True)] == other
    assert conn.encoded == {}  # x-new entered the table: every index moved
    assert [tuple(h) for h in reader.decode(conn.encode(headers), raw=True)] == headers


def test_a_literal_that_is_not_indexed_is_remembered_too() -> None:
    """A peer that indexes nothing (SETTINGS_HEADER_TABLE_SIZE 0, or literals without indexing)
    leaves the table as it was: its blocks are remembered, and an indexed literal after them still
    forgets them."""
    conn = Decoder()
    literal = b"\x00\x03x-c\x011"  # literal without indexing: x-c: 1
    assert conn.decode(literal) == [(b"x-c", b"1")]
    assert conn.decoded == {literal: [(b"x-c", b"1")]}
    conn.decode(hpack.Encoder().encode([(b"x-d", b"2")]))
    assert conn.decoded == {}
