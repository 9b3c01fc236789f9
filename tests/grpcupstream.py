"""A gRPC server the tests control (grpcio's asyncio server, raw-bytes methods), standing where the
model server's gRPC port is: what it received, when a call was cancelled, and the statuses,
metadata and trailers it answers with. Like tests/rawupstream.py for HTTP: the fake engine
(drain_router_dev.fake_model) is vLLM's stand-in; this one is a test double with knobs.

Methods (service ``t.T``), request and response bytes as they are:

- ``Echo`` (unary): answers the request; initial metadata echoes ``x-echo``; the status is the
  request's ``x-status`` metadata (with details ``x-details``), trailers carry ``x-trailer: done``;
  ``x-wait`` (seconds) delays the answer.
- ``Stream`` (server streaming): the request is ``"<count> <interval_ms> [<size>]"``: that many
  messages ``tok<i>`` (padded to ``size`` bytes), one per interval; :attr:`Upstream.sent_bytes`
  counts what it handed to grpcio.
- ``Bidi``: each request message is answered twice, until the client half-closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "t.T"
MAX_MESSAGE = 64 * 1024 * 1024
OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]


def _same(data: bytes) -> bytes:
    return data


@dataclass
class Upstream:
    port: int = 0
    server: Any = None
    calls: list[str] = field(default_factory=list)
    """Each call's method, as it started."""
    active: int = 0
    max_active: int = 0
    """The most ``Stream`` calls active at once."""
    cancelled_at: list[float] = field(default_factory=list)
    """time.monotonic() when a call saw its cancellation."""
    metadata: list[dict[str, str]] = field(default_factory=list)
    health: Any = None
    sent_bytes: int = 0

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls.append("Echo")
        meta = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        self.metadata.append(meta)
        if "x-echo" in meta:
            await context.send_initial_metadata((("x-echo", meta["x-echo"]),))
        if "x-wait" in meta:
            await self._watched(context, asyncio.sleep(float(meta["x-wait"])))
        context.set_trailing_metadata((("x-trailer", "done"),))
        if "x-status" in meta:
            await context.abort(grpc.StatusCode[meta["x-status"]], meta.get("x-details", ""))
        return request

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.calls.append("Stream")
        count, interval, *size = (int(x) for x in request.split())
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for i in range(count):
                if interval and i:
                    await self._watched(context, asyncio.sleep(interval / 1000))
                token = b"tok%d" % i
                if size:
                    token = token.ljust(size[0], b".")
                self.sent_bytes += len(token)
                yield token
        except asyncio.CancelledError:
            self.cancelled_at.append(time.monotonic())
            raise
        finally:
            self.active -= 1

    async def _watched(self, context: grpc.aio.ServicerContext, step: Any) -> None:
        try:
            await step
        except asyncio.CancelledError:
            self.cancelled_at.append(time.monotonic())
            raise

    async def bidi(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.calls.append("Bidi")
        async for message in requests:
            yield message
            yield message

    async def wait_active(self, n: int) -> None:
        from drain_router_dev.process import wait_until

        await wait_until(lambda: self.active == n, timeout=10, what=f"{n} active streams upstream")


@contextlib.asynccontextmanager
async def running(
    *, max_streams: int | None = None, options: tuple[tuple[str, Any], ...] = (), unix_path: str | None = None
) -> AsyncIterator[Upstream]:
    """The test upstream on a free loopback port (``max_streams``: its SETTINGS_MAX_CONCURRENT_STREAMS;
    ``options``: more grpc server options; ``unix_path``: a Unix socket instead of a port)."""
    upstream = Upstream()
    options = [*OPTIONS, *options]
    if max_streams is not None:
        options.append(("grpc.max_concurrent_streams", max_streams))
    server = grpc.aio.server(options=options)
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(upstream.echo, _same, _same),
        "Stream": grpc.unary_stream_rpc_method_handler(upstream.stream, _same, _same),
        "Bidi": grpc.stream_stream_rpc_method_handler(upstream.bidi, _same, _same),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    upstream.health = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(upstream.health, server)
    if unix_path is not None:
        server.add_insecure_port(f"unix:{unix_path}")
    else:
        upstream.port = server.add_insecure_port("127.0.0.1:0")
    upstream.server = server
    await server.start()
    try:
        yield upstream
    finally:
        await server.stop(0)


def channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)


def method(ch: grpc.aio.Channel, name: str) -> Any:
    path = f"/{SERVICE}/{name}"
    if name == "Stream":
        return ch.unary_stream(path, _same, _same)
    if name == "Bidi":
        return ch.stream_stream(path, _same, _same)
    return ch.unary_unary(path, _same, _same)


async def check(port: int, service: str = "") -> int:
    """grpc.health.v1 Check through ``port``: the ServingStatus number."""
    async with channel(port) as ch:
        answer = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(answer.status)
