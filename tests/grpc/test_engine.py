"""vLLM's engine service (the fake engine's gRPC endpoint, vllm_engine.proto) through the router, as
a gateway that tokenizes itself calls it: Generate streamed, Abort, and a cancelled Generate that
frees the engine at once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from drain_router_dev.fake_model import openai, testing
from drain_router_dev.process import wait_until
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight


@pytest.fixture
async def engine() -> AsyncIterator[testing.FakeModel]:
    async with testing.running(openai.Settings(chunks=3, interval_ms=20), grpc=True) as model:
        yield model


def _generate(request_id: str, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id, sampling_params=pb.SamplingParams(max_tokens=max_tokens), stream=True
    )


async def test_generate_streams_every_token_through_the_router(
    grpc_router: StartGrpcRouter, engine: testing.FakeModel
) -> None:
    router = await grpc_router(grpc_upstream=f"http://{engine.grpc_target}")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.grpc_port}") as ch:
        stub = pb_grpc.VllmEngineStub(ch)
        responses = [r async for r in stub.Generate(_generate("g1", 40))]
        health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)
    tokens = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
    assert tokens == list(range(40))
    assert responses[-1].WhichOneof("response") == "complete"
    assert health.healthy
    assert engine.grpc.completed == 1
    assert await grpc_requests(router) == {("0", "completed"): 2.0}


async def test_a_cancelled_generate_frees_the_engine_within_100_ms(
    grpc_router: StartGrpcRouter, engine: testing.FakeModel
) -> None:
    router = await grpc_router(grpc_upstream=f"http://{engine.grpc_target}")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.grpc_port}") as ch:
        call = pb_grpc.VllmEngineStub(ch).Generate(_generate("g2", 10_000))
        assert (await call.read()).HasField("chunk")
        cancelled = time.monotonic()
        call.cancel()
        await wait_until(lambda: engine.grpc.cancellations, timeout=5, what="the engine to see the cancel")
    assert engine.grpc.cancellations[0].at - cancelled < 0.1
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
