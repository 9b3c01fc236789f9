"""A Triton-shaped raw-bytes service, ``inference.GRPCInferenceService``, on the fake model: :func:`handler`.

Triton's messages are not needed to test a proxy: both methods carry raw bytes (no serializers), and
only the method paths are Triton's.

- ``ModelStreamInfer`` (bidirectional streaming, as Triton's decoupled models use it): for each
  request message, the same bytes back at once, then, ``--interval-ms`` later, ``end <i>`` (``i``
  the message's index in the stream, from 0); the call ends when the client half-closes;
- ``Echo`` (unary): the request's bytes back, for large-message tests (up to
  :data:`.grpc_server.MAX_MESSAGE_BYTES`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from drain_router_dev.fake_model import openai
from drain_router_dev.fake_model.calls import Call
from drain_router_dev.fake_model.state import State

SERVICE = "inference.GRPCInferenceService"


def end_of(index: int) -> bytes:
    """``ModelStreamInfer``'s last answer to the request message at ``index``."""
    return f"end {index}".encode()


class Inference:
    """The two methods' behaviours: on one server's settings and state."""

    def __init__(self, settings: openai.Settings, state: State) -> None:
        self.settings, self.state = settings, state

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Any) -> None:
        with Call(self.state.grpc, "ModelStreamInfer"):
            index = 0
            async for message in requests:
                await context.write(message)
                await asyncio.sleep(self.settings.interval_ms / 1000)
                await context.write(end_of(index))
                index += 1

    async def echo(self, request: bytes, context: Any) -> bytes:
        with Call(self.state.grpc, "Echo"):
            return request


def handler(settings: openai.Settings, state: State) -> Any:
    """The service's ``grpc.GenericRpcHandler``: raw bytes in and out."""
    inference = Inference(settings, state)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(inference.model_stream_infer),
            "Echo": grpc.unary_unary_rpc_method_handler(inference.echo),
        },
    )
