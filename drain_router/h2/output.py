"""What one end of an HTTP/2 connection has to write, sans-IO: frames are queued in the order they
were built, the I/O layer is told when the first one is (``ready``) and takes them all at once
(:meth:`Output.data_to_send`), once per turn of its event loop.

The I/O layer also says when its transport pauses (the peer does not read) and resumes. Relayed DATA
queued meanwhile is bounded by the flow-control windows; everything else (control frames, header
blocks) is counted while paused, and past ``max_backlog`` the connection fails with
ENHANCE_YOUR_CALM (:meth:`Output.control` says so; the connection acts on it).
"""

from __future__ import annotations

from collections.abc import Callable


class Output:
    """One end's queued output and its transport's back-pressure."""

    __slots__ = ("backlog", "max_backlog", "paused", "queued", "ready")

    def __init__(self, ready: Callable[[], None], max_backlog: int | None) -> None:
        self.ready = ready
        """Called when a frame is queued while there was none (the connection's ``output_ready``)."""
        self.queued: list[bytes] = []
        self.paused = False
        """The transport's buffer is above its high-water mark (set by the I/O layer)."""
        self.max_backlog = max_backlog
        """Bytes other than relayed DATA that may wait while paused (None: no bound)."""
        self.backlog = 0
        """Bytes other than relayed DATA queued since the transport paused."""

    def queue(self, data: bytes) -> None:
        """Queue relayed DATA (the windows bound it), or a frame that is never held back."""
        if not self.queued:
            self.ready()
        self.queued.append(data)

    def control(self, data: bytes) -> bool:
        """Queue a frame that is not relayed DATA, counted against the bound while paused; False,
        with nothing queued, once it is past the bound."""
        if self.paused and self.max_backlog is not None:
            self.backlog += len(data)
            if self.backlog > self.max_backlog:
                return False
        if not self.queued:
            self.ready()
        self.queued.append(data)
        return True

    def data_to_send(self) -> bytes:
        """Everything queued, in order (the queue is left empty)."""
        data = b"".join(self.queued)
        self.queued.clear()
        return data

    def clear(self) -> None:
        """Drop what is queued (the connection failed or its transport closed)."""
        self.queued.clear()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """The transport took its buffer: the bound starts again from nothing."""
        self.paused = False
        self.backlog = 0
