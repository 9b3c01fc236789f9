"""The fake model's optional gRPC endpoint (``--grpc-port``): :class:`GrpcEndpoint`, in the same process
and event loop as its HTTP application, counting into the same :class:`.state.State`.

It serves vLLM's engine service (:mod:`.grpc_engine`), a Triton-shaped raw-bytes service
(:mod:`.grpc_inference`) and ``grpc.health.v1.Health`` (SERVING for ``""`` and vLLM's service while
running, NOT_SERVING once a shutdown starts). Messages up to :data:`MAX_MESSAGE_BYTES` each way.
"""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from drain_router_dev.fake_model import grpc_engine, grpc_inference, openai
from drain_router_dev.fake_model.state import State

MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message the endpoint receives or sends (grpcio's default receive limit is 4 MiB)."""
OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
"""The channel options a client needs too, to carry messages that large."""
SERVER_OPTIONS = (*OPTIONS, ("grpc.so_reuseport", 0))
"""No SO_REUSEPORT (grpcio's default sets it): a second server on a port in use fails to bind
instead of sharing its connections."""


class GrpcEndpoint:
    """One gRPC server of the fake model: its services, its health, its shutdown."""

    def __init__(self, settings: openai.Settings, state: State) -> None:
        self.state = state
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.server.add_generic_rpc_handlers(
            (grpc_engine.handler(settings, state), grpc_inference.handler(settings, state))
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port) and serve; the port. ``OSError`` if it cannot bind."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound: int = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio's "Failed to bind to address"
            raise OSError(f"gRPC on {address}: {exc}") from None
        await self.server.start()
        await self.health.set(grpc_engine.SERVICE, health_pb2.HealthCheckResponse.SERVING)
        return bound

    async def stop(self, timeout: float) -> None:
        """vLLM's ``--shutdown-timeout`` on gRPC: health NOT_SERVING first; then grpcio's
        ``stop(grace)``: no new calls (GOAWAY to every connection), the calls in flight get up to
        ``timeout`` s, those still running then are cancelled (counted as ``shutdown_aborted``).
        ``timeout`` 0 cancels them at once."""
        await self.health.enter_graceful_shutdown()
        self.state.grpc.abort_at = time.monotonic() + timeout
        await self.server.stop(timeout)
