"""vLLM's gRPC engine service, ``vllm.grpc.engine.VllmEngine``, on the fake model: :func:`handler`.

The messages are vLLM's own (``vllm_engine.proto``, generated in ``smg_grpc_proto``). Three methods
answer; the service's others are UNIMPLEMENTED (grpcio's answer for a method no handler names):

- ``Generate`` (server streaming): the request's ``sampling_params.max_tokens`` tokens (else
  ``--chunks``), paced as the HTTP completions are (``--first-token-ms``, then one every
  ``--interval-ms``). Token ids are the sequence numbers 0, 1, ..., so a client can tell a complete
  stream. With ``stream`` each token is a ``chunk``; the last message is always a ``complete`` with
  every token and finish reason ``length``, or ``abort`` with the tokens so far if ``Abort`` named it;
- ``Abort``: ends the running ``Generate`` calls with those request ids at their next pause;
- ``HealthCheck``: healthy while ``/health`` answers 200 (the same :attr:`.state.State.status`).
"""

from __future__ import annotations

from typing import Any

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from drain_router_dev.fake_model import openai
from drain_router_dev.fake_model.calls import Call
from drain_router_dev.fake_model.state import State

SERVICE: str = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
"""``vllm.grpc.engine.VllmEngine``: the service's full name, as ``grpc.health.v1`` reports it."""


class Engine:
    """The three methods' behaviours: on one server's settings and state."""

    def __init__(self, settings: openai.Settings, state: State) -> None:
        self.settings, self.state = settings, state

    def tokens(self, request: Any) -> int | None:
        """How many tokens ``request`` (a ``GenerateRequest``) asks for; ``None``: more than the fake makes."""
        params = request.sampling_params
        asked = int(params.max_tokens) if params.HasField("max_tokens") else self.settings.chunks
        return asked if asked <= openai.MAX_CHUNKS else None

    async def generate(self, request: Any, context: Any) -> None:
        n = self.tokens(request)
        if n is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_tokens must be at most {openai.MAX_CHUNKS}")
            return
        prompt = len(request.tokenized.input_ids)
        with Call(self.state.grpc, "Generate", request.request_id) as call:
            tokens = await self._decode(call, n, prompt, context if request.stream else None)
            await context.write(pb.GenerateResponse(complete=_complete(tokens, prompt, aborted=call.aborted)))

    async def _decode(self, call: Call, n: int, prompt: int, context: Any) -> list[int]:
        """Up to ``n`` paced tokens, each written as a ``chunk`` to ``context`` if given (a stream),
        fewer if ``Abort`` comes; the tokens made."""
        tokens: list[int] = []
        if await call.pause(self.settings.first_token_ms / 1000):
            return tokens
        for seq in range(n):
            if seq and await call.pause(self.settings.interval_ms / 1000):
                break
            tokens.append(seq)
            if context is not None:
                chunk = pb.GenerateStreamChunk(token_ids=[seq], prompt_tokens=prompt, completion_tokens=seq + 1)
                await context.write(pb.GenerateResponse(chunk=chunk))
        return tokens

    async def abort(self, request: Any, context: Any) -> Any:
        self.state.grpc.abort(list(request.request_ids))
        return pb.AbortResponse()

    async def health_check(self, request: Any, context: Any) -> Any:
        status = self.state.status
        return pb.HealthCheckResponse(healthy=status == "ok", message=status)


def _complete(tokens: list[int], prompt: int, *, aborted: bool) -> Any:
    """``Generate``'s last message: every token it made, and why it stopped."""
    return pb.GenerateComplete(
        output_ids=tokens,
        finish_reason="abort" if aborted else "length",
        prompt_tokens=prompt,
        completion_tokens=len(tokens),
    )


def handler(settings: openai.Settings, state: State) -> Any:
    """The service's ``grpc.GenericRpcHandler``: its answering methods, with vLLM's messages."""
    engine = Engine(settings, state)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Generate": grpc.unary_stream_rpc_method_handler(
                engine.generate,
                request_deserializer=pb.GenerateRequest.FromString,
                response_serializer=pb.GenerateResponse.SerializeToString,
            ),
            "Abort": grpc.unary_unary_rpc_method_handler(
                engine.abort,
                request_deserializer=pb.AbortRequest.FromString,
                response_serializer=pb.AbortResponse.SerializeToString,
            ),
            "HealthCheck": grpc.unary_unary_rpc_method_handler(
                engine.health_check,
                request_deserializer=pb.HealthCheckRequest.FromString,
                response_serializer=pb.HealthCheckResponse.SerializeToString,
            ),
        },
    )
