"""Where a relayed health Watch is between two gRPC messages, so the router can put NOT_SERVING there
at SIGTERM. Pure: no I/O."""

from __future__ import annotations


class MessageBoundaries:
    """Follows the length-prefixed messages (1 flag byte, 4 length bytes, the message) of a stream."""

    __slots__ = ("left", "pending_not_serving", "prefix")

    def __init__(self) -> None:
        self.left = 0
        """Bytes of the current message still to come."""
        self.prefix = b""
        """A message prefix read in part."""
        self.pending_not_serving = False
        """NOT_SERVING waits for the next boundary."""

    def follow(self, data: bytes) -> None:
        i, size = 0, len(data)
        while i < size:
            if self.left == 0:
                need = 5 - len(self.prefix)
                self.prefix += data[i : i + need]
                i += need
                if len(self.prefix) == 5:
                    self.left = int.from_bytes(self.prefix[1:5], "big")
                    self.prefix = b""
            else:
                take = min(self.left, size - i)
                self.left -= take
                i += take

    def between(self) -> bool:
        """At a boundary: no message begun and not finished."""
        return self.left == 0 and not self.prefix
