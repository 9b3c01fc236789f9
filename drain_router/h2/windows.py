"""A connection's flow-control windows (RFC 9113 §6.9), both ways. Sans-IO.

This end sends DATA within two of the peer's windows: the connection's (:attr:`Windows.send`) and the
stream's (``Stream.send_window``, which starts at the peer's SETTINGS_INITIAL_WINDOW_SIZE,
:attr:`Windows.peer_initial`). The peer sends within this end's: the connection's
(:attr:`Windows.recv`) is opened to :data:`rules.CONNECTION_WINDOW` by this end's preface and given
back as soon as a quarter of it has arrived (:data:`ANNOUNCE_AT`), since the stream windows bound
what waits; a stream's is re-opened only as the other side takes its bytes (``Connection.grant``).
"""

from __future__ import annotations

from typing import Final

from drain_router.h2 import frames
from drain_router.h2 import rules as r
from drain_router.h2.frames import H2Error

ANNOUNCE_AT: Final = r.CONNECTION_WINDOW // 4
"""Received bytes whose credit is given back in one connection WINDOW_UPDATE."""


class Windows:
    """The connection's windows each way, the credit received but not yet given back, and the
    peer's initial stream window. A DATA frame each way updates :attr:`send`, :attr:`recv` and
    :attr:`unannounced` inline (the connection's per-frame path); every other change goes through
    a method, which raises :class:`~drain_router.h2.frames.H2Error` for what the peer may not do."""

    __slots__ = ("peer_initial", "recv", "send", "unannounced")

    def __init__(self) -> None:
        self.send = frames.DEFAULT_WINDOW
        """What this end may still send on the connection."""
        self.recv = frames.DEFAULT_WINDOW
        """What the peer may still send on the connection."""
        self.unannounced = 0
        """Bytes received whose credit is not given back yet (up to :data:`ANNOUNCE_AT`)."""
        self.peer_initial = frames.DEFAULT_WINDOW
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: the send window a new stream starts with."""

    def open_recv(self) -> int:
        """This end's preface opens the connection to :data:`rules.CONNECTION_WINDOW`: the increment
        of the WINDOW_UPDATE that says so."""
        self.recv = r.CONNECTION_WINDOW
        return r.CONNECTION_WINDOW - frames.DEFAULT_WINDOW

    def announce(self) -> int:
        """Give back the credit received so far: the increment of a connection WINDOW_UPDATE."""
        increment = self.unannounced
        self.recv += increment
        self.unannounced = 0
        return increment

    def send_opened(self, increment: int) -> None:
        """The peer's WINDOW_UPDATE on the connection (§6.9.1)."""
        if increment == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        self.send += increment
        if self.send > frames.MAX_WINDOW:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "connection window overflow")

    def peer_initial_changed(self, value: int) -> int:
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: what every open stream's send window moves by
        (§6.9.2)."""
        if value > frames.MAX_WINDOW:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
        delta = value - self.peer_initial
        self.peer_initial = value
        return delta
