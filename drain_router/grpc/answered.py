"""``grpc.health.v1.Health`` answered by the router itself: NOT_SERVING in starting, draining and
closing. A Check gets one answer; a Watch stays open with NOT_SERVING, and when the router
starts serving it ends UNAVAILABLE so the client watches again (relayed to the model server then).
Never counted in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from drain_router.decisions.grpc_status import GrpcStatus
from drain_router.grpc import answers, health
from drain_router.h2 import frames
from drain_router.h2.connection import Connection
from drain_router.h2.streams import Exit, Headers, Stream

SERVING_NOW_MESSAGE = "the router is serving now; watch again"


class LocalHealth:
    __slots__ = ("answered", "conn", "down", "forget", "watch")

    def __init__(self, conn: Connection, stream: Stream, path: bytes, forget: Callable[[LocalHealth], None]) -> None:
        self.conn = conn
        self.down = stream
        stream.handler = self
        self.watch = path == health.WATCH
        self.forget = forget
        self.answered = False

    def start(self, end: bool) -> None:
        if self.watch:
            self.answered = True
            self.conn.send_headers(self.down, answers.response_head(), False)
            self.conn.send_data(self.down, health.message(health.NOT_SERVING), False)
        elif end:
            self.answer()

    def answer(self) -> None:
        if self.answered:
            return
        self.answered = True
        down, conn = self.down, self.conn
        conn.send_headers(down, answers.response_head(), False)
        conn.send_data(down, health.message(health.NOT_SERVING), False)
        conn.send_headers(down, answers.trailers(GrpcStatus.OK), True)

    def serving_now(self) -> None:
        """The router is serving: a Watch ends, so its client watches again (relayed this time)."""
        self.conn.send_headers(self.down, answers.trailers(GrpcStatus.UNAVAILABLE, SERVING_NOW_MESSAGE), True)

    def not_serving(self) -> None:
        """Already NOT_SERVING: nothing to push."""

    # -- streams.Handler --------------------------------------------------------------------------

    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        self.conn.grant(stream, len(data))
        if end and not self.watch:
            self.answer()

    def on_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        if end and not self.watch:
            self.answer()

    def on_closed(self, stream: Stream, exit: Exit, code: int) -> None:
        self.forget(self)

    def on_sent(self, stream: Stream, n: int) -> None: ...

    def on_end_sent(self, stream: Stream) -> None:
        # Answered while the client was still sending: it may stop (RFC 9113 §8.1).
        self.conn.reset(stream, frames.NO_ERROR)

    def on_writable(self, stream: Stream) -> None: ...
