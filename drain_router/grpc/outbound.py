"""One h2c connection to the model server's gRPC port (the router is the HTTP/2 client).

Streams are opened on it by :mod:`~drain_router.grpc.pool` for relayed calls. When the model
server sends GOAWAY, the streams it accepted (up to its last stream id) run on and the others leave
as REFUSED (the client gets REFUSED_STREAM, which gRPC clients retry transparently); the pool opens
new streams on another connection, and this one closes when its last stream ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from drain_router import logs
from drain_router.grpc.connection import Flusher, Wire
from drain_router.h2 import frames
from drain_router.h2.connection import Connection
from drain_router.h2.streams import Handler, Headers, Stream

log = logs.get("drain_router.grpc")


class Outbound(Wire):
    def __init__(
        self,
        flusher: Flusher,
        on_settled: Callable[[Outbound], None],
        on_closed: Callable[[Outbound], None],
        on_limit: Callable[[int], None],
    ) -> None:
        super().__init__(flusher)
        self.core = Connection(self, client_side=True)
        self.goaway: int | None = None
        """The last stream id of the model server's GOAWAY: no new streams here."""
        self.peer_max_streams: int | None = None
        self.settled = asyncio.Event()
        """Set once the model server's first SETTINGS arrived (its stream limit is known)."""
        self._on_settled = on_settled
        self._on_closed = on_closed
        self._on_limit = on_limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)
        self.core.initiate()
        self.flush()

    def usable(self) -> bool:
        """Can take one more stream now."""
        core = self.core
        if core.failed or self.goaway is not None or core.next_stream > frames.MAX_STREAM_ID:
            return False
        return self.peer_max_streams is None or len(core.streams) < self.peer_max_streams

    def open(self, handler: Handler, headers: Headers, end: bool) -> Stream:
        """A new stream carrying ``headers``."""
        return self.core.open_stream(handler, headers, end)

    # -- the core's events ------------------------------------------------------------------------

    def settings_applied(self, values: dict[int, int]) -> None:
        limit = values.get(frames.MAX_CONCURRENT_STREAMS)
        if limit is not None:
            self.peer_max_streams = limit
            self._on_limit(limit)
        if not self.settled.is_set():
            self.settled.set()
            self._on_settled(self)

    def goaway_received(self, last_stream: int, code: int) -> None:
        log.info(
            "grpc.upstream_goaway", last_stream_id=last_stream, error_code=code, open_streams=len(self.core.streams)
        )
        self.goaway = last_stream if self.goaway is None else min(self.goaway, last_stream)
        self.stream_gone()

    def stream_gone(self) -> None:
        if self.goaway is not None and not self.core.streams and self.transport is not None:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.settled.set()
        self._on_closed(self)
        self.flusher.flush()
