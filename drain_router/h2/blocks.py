"""Header blocks as the peer sends them, sans-IO: a HEADERS frame and the CONTINUATION frames after it
assembled into one block (RFC 9113 §4.3), bounded as each frame arrives
(:data:`rules.MAX_HEADER_BLOCK_BYTES`, against the CONTINUATION flood), and HPACK-decoded: every
block, even one for a stream it is then dropped on, since the decoder's table must stay in step with
the peer's encoder.

A list decoded from a remembered block is the same object each time (:mod:`.hpackcache`) and is
never changed after decoding, so its check by a rule of :mod:`.rules` is remembered with it
(:meth:`HeaderBlocks.checked`). What a block means for its stream is the connection's to decide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from drain_router.h2 import frames, hpackcache
from drain_router.h2 import rules as r
from drain_router.h2.frames import H2Error
from drain_router.h2.streams import Headers

T = TypeVar("T")

Block = tuple[Headers, bool, bool]
"""A whole block, decoded: its header list, whether it ends its stream, whether its HEADERS made the
stream depend on itself (a stream error, §5.3.1)."""


class HeaderBlocks:
    """The peer's header blocks on one connection: the one being assembled, the HPACK decoder, and
    the header lists already checked."""

    __slots__ = ("checked_lists", "decoder", "partial")

    def __init__(self) -> None:
        self.decoder = hpackcache.Decoder()
        self.partial: tuple[int, int, bytearray, bool] | None = None
        """A block whose CONTINUATION frames are still to come: (stream, flags, bytes, depends on
        itself). No other frame may come in between (the connection checks it)."""
        self.checked_lists: dict[int, tuple[Headers, object, object]] = {}
        """Header lists already checked, by identity (see :meth:`checked`)."""

    def headers_frame(self, flags: int, sid: int, payload: bytes) -> Block | None:
        """A HEADERS frame: its block, when the frame carries all of it (END_HEADERS); else None,
        and CONTINUATION frames follow."""
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        body = frames.strip_padding(flags, payload)
        if body is None:
            raise H2Error(frames.PROTOCOL_ERROR, "invalid padding")
        self_dependent = False
        if flags & frames.PRIORITY_FLAG:
            if len(body) < 5:
                raise H2Error(frames.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            self_dependent = int.from_bytes(body[:4], "big") & 0x7FFFFFFF == sid
            body = body[5:]
        if flags & frames.END_HEADERS:
            return self.decoded(flags, body, self_dependent)
        self.partial = (sid, flags, bytearray(body), self_dependent)
        self.check_size(len(body))
        return None

    def continuation_frame(self, flags: int, sid: int, payload: bytes) -> Block | None:
        """A CONTINUATION frame: the block it completes (END_HEADERS), or None while more follow."""
        block = self.partial
        if block is None or block[0] != sid:
            raise H2Error(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block[2].extend(payload)
        self.check_size(len(block[2]))
        if flags & frames.END_HEADERS:
            self.partial = None
            return self.decoded(block[1], bytes(block[2]), block[3])
        return None

    def check_size(self, size: int) -> None:
        if size > r.MAX_HEADER_BLOCK_BYTES:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header block too large")

    def decoded(self, flags: int, block: bytes, self_dependent: bool) -> Block:
        try:
            headers = self.decoder.decode(block)
        except hpackcache.HeaderListTooLarge:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header list too large") from None
        except hpackcache.CompressionError:
            raise H2Error(frames.COMPRESSION_ERROR, "invalid header block") from None
        return headers, bool(flags & frames.END_STREAM), self_dependent

    def checked(self, headers: Headers, rule: Callable[[Headers], T]) -> T:
        """``rule(headers)``, remembered: a list decoded from a remembered block is the same object
        each time (never changed after decoding), so its check is remembered with it, held so its
        identity cannot be reused. Raises :class:`rules.Malformed` (never remembered)."""
        known = self.checked_lists.get(id(headers))
        if known is not None and known[0] is headers and known[1] is rule:
            return cast(T, known[2])
        result = rule(headers)
        if len(self.checked_lists) >= hpackcache.CACHE_ENTRIES:
            self.checked_lists.clear()
        self.checked_lists[id(headers)] = (headers, rule, result)
        return result
