"""One h2c connection to the model server's gRPC port (the router is the HTTP/2 client).

Streams are opened on it by :mod:`~drain_router.proxy.grpc.pool` for relayed calls. When the model
server sends GOAWAY, the streams it accepted (up to its last stream id) run on and the others are
refused to the client with REFUSED_STREAM, which gRPC clients retry transparently; the pool opens new
streams on another connection, and this one closes when its last stream ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from drain_router import logs
from drain_router.proxy.grpc import frames
from drain_router.proxy.grpc.connection import Connection, H2Error, Headers, Leg, Relay, flush_all

log = logs.get("drain_router.grpc")


class Outbound(Connection):
    CLIENT_SIDE = True

    def __init__(
        self,
        on_settled: Callable[[Outbound], None],
        on_closed: Callable[[Outbound], None],
        on_limit: Callable[[int], None],
    ) -> None:
        super().__init__()
        self.next_stream = 1
        self.goaway: int | None = None
        """The last stream id of the model server's GOAWAY: no new streams here."""
        self.settled = asyncio.Event()
        """Set once the model server's first SETTINGS arrived (its stream limit is known)."""
        self._on_settled = on_settled
        self._on_closed = on_closed
        self._on_limit = on_limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.write(frames.PREFACE + self.local_settings())

    def usable(self) -> bool:
        """Can take one more stream now."""
        if self.closed or self.goaway is not None or self.next_stream > frames.MAX_STREAM_ID:
            return False
        return self.peer_max_streams is None or len(self.legs) < self.peer_max_streams

    def open(self, relay: Relay, headers: Headers, end: bool) -> Leg:
        """A new stream carrying ``headers``."""
        sid = self.next_stream
        self.next_stream += 2
        leg = Leg(self, sid, relay)
        self.legs[sid] = leg
        self.send_headers(leg, headers, end)
        return leg

    def settings_received(self) -> None:
        if not self.settled.is_set():
            self.settled.set()
            self._on_settled(self)

    def streams_limited(self, limit: int) -> None:
        self._on_limit(limit)

    def new_stream(self, sid: int, headers: Headers, end: bool) -> None:
        if sid in self.reset_streams:
            return  # sent before the model server saw the router's RST_STREAM: ignored (§5.1)
        raise H2Error(frames.PROTOCOL_ERROR, "the model server opened a stream")

    def goaway_received(self, last_stream: int, code: int) -> None:
        log.info("grpc.upstream_goaway", last_stream_id=last_stream, error_code=code, open_streams=len(self.legs))
        self.goaway = last_stream if self.goaway is None else min(self.goaway, last_stream)
        refused = [leg for sid, leg in self.legs.items() if sid > last_stream]
        for leg in refused:
            self.forget(leg)
            leg.relay.on_reset(leg, frames.REFUSED_STREAM)
        self.leg_gone(None)

    def leg_gone(self, leg: Leg | None) -> None:
        if self.goaway is not None and not self.legs and not self.closed:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.settled.set()
        self._on_closed(self)
        flush_all()
