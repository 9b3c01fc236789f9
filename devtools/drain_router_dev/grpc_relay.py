"""The demo balancer's gRPC side: each call relayed, message by message, to a backend in rotation.

A grpcio server on loopback (h2c, as gRPC clients speak it) whose one generic handler takes every
method as a bidirectional stream (a call's cardinality is not on the wire, so unary and streaming
calls are relayed alike) and opens the same call over a channel to the backend
:class:`~drain_router_dev.balancer.Balancer` picks, round robin with its HTTP requests (the same
probes decide the rotation). Like the HTTP side it never retries: a backend that refuses or drops
the call ends it with the backend's status (UNAVAILABLE for a refused connection), so a client sees
every loss. Messages pass as bytes, never decoded; the call's deadline is passed on, its other
metadata is not (the demo's calls carry none). Needs grpcio (the devtools distribution's dependencies).
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc


class Backend(Protocol):
    """What the relay needs of the balancer's backend (it never imports the balancer): where its gRPC
    side is, and the counts the balancer shows."""

    grpc_target: str | None
    active: int
    errors: collections.Counter[str]


CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
)
"""A channel whose backend refused a connection waits before it tries again (1 s, growing to 2 min,
by grpcio's default) and fails every call meanwhile, even once the backend is back in rotation: a
balancer connects anew for the next request instead. So the channels retry within 100 ms."""


class GrpcRelay:
    """The relay's server and its channels to the backends; ``pick()`` chooses each call's backend."""

    def __init__(self, pick: Callable[[], Backend | None]) -> None:
        self.pick = pick
        self.port: int | None = None
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self._channels: dict[str, Any] = {}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        return self.port

    async def stop(self) -> None:
        await self._server.stop(0)
        for channel in self._channels.values():
            await channel.close()

    async def relay(self, method: str, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """One call: to the backend picked now, its messages passed on both ways until it ends."""
        backend = self.pick()
        if backend is None or backend.grpc_target is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no backend in rotation")
            return
        channel = self._channels.get(backend.grpc_target)
        if channel is None:
            channel = self._channels[backend.grpc_target] = grpc.aio.insecure_channel(
                backend.grpc_target, options=CHANNEL_OPTIONS
            )
        upstream = channel.stream_stream(method)(requests, timeout=context.time_remaining())
        backend.active += 1
        try:
            async for message in upstream:
                yield message
        except grpc.aio.AioRpcError as exc:
            backend.errors[f"gRPC {exc.code().name}"] += 1
            await context.abort(exc.code(), exc.details() or "")
        finally:
            backend.active -= 1
            upstream.cancel()  # a no-op once it ended (grpcio cancels it too when this handler is)


class _Handler:
    """A ``grpc.GenericRpcHandler`` (grpcio takes any object with its ``service`` method): every
    method, as a bidirectional stream of bytes, to :meth:`GrpcRelay.relay`."""

    def __init__(self, relay: GrpcRelay) -> None:
        self.relay = relay

    def service(self, handler_call_details: Any) -> Any:
        method = str(handler_call_details.method)

        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for message in self.relay.relay(method, requests, context):
                yield message

        return grpc.stream_stream_rpc_method_handler(handle)
