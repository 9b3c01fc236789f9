"""A WebSocket handshake (RFC 6455 §4.1): an exchange like any other until the model server answers
it, forwarded with its head rewritten for the upstream (:func:`~.heads.websocket_request`) and
counted in flight. If the answer is a valid 101, it is relayed and the client connection and the
upstream connection become one tunnel (:mod:`.websocket.tunnel`), which the handshake stays in flight for;
at the in-flight deadline the tunnel is closed with Close 1001 both ways, not cut."""

from __future__ import annotations

from drain_router.http1.exchange import Client, Destination, Exchange
from drain_router.http1.heads import RequestHead, switching_head
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.metrics import Outcome


class Handshake(Exchange):
    __slots__ = ()

    def __init__(
        self,
        client: Client,
        dest: Destination,
        method: bytes,
        target: bytes,
        http10: bool,
        keep_alive: bool,
        request: RequestHead,
        key: bytes,
    ) -> None:
        super().__init__(client, dest, method, target, http10, keep_alive, request, None)
        self.ws_key = key

    def switch(self, up: UpstreamConnection, headers: list[tuple[bytes, bytes]], rest: bytes) -> None:
        """The upstream's 101 answered this handshake: relay it, and tunnel both connections from
        here on (``rest``: what the upstream sent after it in the same read)."""
        client = self.client
        self.code = 101
        self.upstream = None
        if client.transport is None:
            self.finish(Outcome.CLIENT_ABORTED)
            up.transport.abort()
            return
        client.transport.write(switching_head(headers))
        self.head_sent = True
        listener = client.listener
        listener.metrics.ttfb.observe(listener.loop.time() - self.started_at)
        client.open_tunnel(up, rest)

    def abort_deadline(self) -> None:
        tunnel = self.client.tunnel
        if tunnel is not None and not self.finished and self.code == 101:
            tunnel.going_away(Outcome.DEADLINE_ABORTED)  # Close 1001 both ways; it finishes when they are done
            return
        super().abort_deadline()
