"""The fake model's gRPC endpoint, through real grpcio clients: vLLM's engine service (Generate, Abort,
HealthCheck), grpc.health.v1, the Triton-shaped raw-bytes service, and its counters."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from drain_router_dev import fake_model
from drain_router_dev import process as process_
from drain_router_dev.fake_model import grpc_engine, grpc_inference, grpc_server, testing
from drain_router_dev.process import wait_until
from tests.process import log_path

SERVING = health_pb2.HealthCheckResponse.SERVING


class Served:
    """One in-loop fake model with gRPC, and a channel to it."""

    def __init__(self, model: testing.FakeModel, channel: Any) -> None:
        self.model, self.channel = model, channel
        self.engine = pb_grpc.VllmEngineStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)

    def raw(self, method: str) -> str:
        return f"/{grpc_inference.SERVICE}/{method}"


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(**settings)``: the fake model with gRPC in this loop, and a channel that takes
    messages as large as the server does."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**settings: Any) -> Served:
            model = await stack.enter_async_context(testing.running(fake_model.Settings(**settings), grpc=True))
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(model.grpc_target, options=grpc_server.OPTIONS)
            )
            return Served(model, channel)

        yield start


def _generate(request_id: str, max_tokens: int | None = None, *, stream: bool = True) -> Any:
    params = pb.SamplingParams() if max_tokens is None else pb.SamplingParams(max_tokens=max_tokens)
    return pb.GenerateRequest(request_id=request_id, sampling_params=params, stream=stream)


async def _rest(call: Any) -> list[Any]:
    """The messages of a stream that was read with ``read()`` so far, up to its end."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


def _tokens(responses: list[Any]) -> list[int]:
    """The token ids of a Generate stream's chunks, in order."""
    return [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]


@pytest.mark.parametrize(("max_tokens", "expected"), [(5, 5), (None, 3), (0, 0)], ids=["max-tokens", "default", "zero"])
async def test_generate_streams_the_tokens_asked_for(serve: Serve, max_tokens: int | None, expected: int) -> None:
    """1. Generate with max_tokens (or none: the server's --chunks, 3 here). Result: that many chunks,
    numbered 0..n-1, then one complete with every token and finish reason length."""
    served = await serve(chunks=3, interval_ms=1)
    responses = [r async for r in served.engine.Generate(_generate("g", max_tokens))]
    assert _tokens(responses) == list(range(expected))
    assert [r.WhichOneof("response") for r in responses] == ["chunk"] * expected + ["complete"]
    complete = responses[-1].complete
    assert (list(complete.output_ids), complete.finish_reason) == (list(range(expected)), "length")
    assert served.model.grpc.completed == 1


async def test_generate_without_stream_answers_once(serve: Serve) -> None:
    served = await serve(interval_ms=1)
    responses = [r async for r in served.engine.Generate(_generate("g", 4, stream=False))]
    assert [r.WhichOneof("response") for r in responses] == ["complete"]
    assert list(responses[0].complete.output_ids) == [0, 1, 2, 3]


async def test_generate_is_paced_by_the_interval_setting(serve: Serve) -> None:
    """1. Generate 5 tokens on --interval-ms 60. Result: the stream takes at least the 4 gaps (240 ms),
    as an HTTP completion does."""
    served = await serve(interval_ms=60)
    started = time.monotonic()
    responses = [r async for r in served.engine.Generate(_generate("g", 5))]
    assert len(_tokens(responses)) == 5
    assert time.monotonic() - started >= 0.24


async def test_generate_refuses_more_tokens_than_the_fake_makes(serve: Serve) -> None:
    served = await serve()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.engine.Generate(_generate("g", fake_model.openai.MAX_CHUNKS + 1)).read()
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert served.model.grpc.started == 0


async def test_abort_ends_a_running_generate(serve: Serve) -> None:
    """1. Generate 1000 tokens, 20 ms apart 2. after the first, Abort names it. Result: the stream
    ends at once with a complete of finish reason abort and the tokens so far; counted aborted."""
    served = await serve(interval_ms=20)
    call = served.engine.Generate(_generate("to-abort", 1000))
    first = await call.read()
    assert list(first.chunk.token_ids) == [0]
    await served.engine.Abort(pb.AbortRequest(request_ids=["other", "to-abort"]))
    rest = await _rest(call)
    complete = rest[-1].complete
    assert complete.finish_reason == "abort"
    assert list(complete.output_ids) == [0, *_tokens(rest)]
    assert len(complete.output_ids) < 100, "the stream was not cut short"
    assert (served.model.grpc.aborted, served.model.grpc.completed) == (1, 0)


async def test_client_cancel_is_recorded_with_when_the_server_saw_it(serve: Serve) -> None:
    """1. Generate runs 2. the client cancels it. Result: counted cancelled (not completed or failed),
    with its request id and the server's monotonic time, within 100 ms of the cancel."""
    served = await serve(interval_ms=20)
    call = served.engine.Generate(_generate("to-cancel", 1000))
    await call.read()
    cancelled_at = time.monotonic()
    call.cancel()
    calls = served.model.grpc
    await wait_until(lambda: calls.active == 0, 5, "the call to end")
    assert (calls.cancelled, calls.completed, calls.failed) == (1, 0, 0)
    [seen] = calls.cancellations
    assert (seen.method, seen.request_id) == ("Generate", "to-cancel")
    assert 0 <= seen.at - cancelled_at < 0.1, seen.at - cancelled_at


async def test_health_check_follows_the_servers_health(serve: Serve) -> None:
    """vLLM's HealthCheck and grpc.health.v1 answer SERVING; HealthCheck turns unhealthy with /health."""
    served = await serve()
    answer = await served.engine.HealthCheck(pb.HealthCheckRequest())
    assert (answer.healthy, answer.message) == (True, "ok")
    for service in ("", grpc_engine.SERVICE):
        assert (await served.health.Check(health_pb2.HealthCheckRequest(service=service))).status == SERVING
    served.model.healthy = False
    answer = await served.engine.HealthCheck(pb.HealthCheckRequest())
    assert (answer.healthy, answer.message) == (False, "unhealthy")


async def test_other_engine_methods_are_unimplemented(serve: Serve) -> None:
    served = await serve()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.engine.GetModelInfo(pb.GetModelInfoRequest())
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_model_stream_infer_answers_each_message_until_the_client_half_closes(serve: Serve) -> None:
    """1. ModelStreamInfer: three messages, each sent after the previous one's answers 2. half-close.
    Result: each message is echoed, then ``end <i>``; the call ends OK and counts completed."""
    served = await serve(interval_ms=5)
    call = served.channel.stream_stream(served.raw("ModelStreamInfer"))()
    answers = []
    for i in range(3):
        await call.write(f"request {i}".encode())
        answers += [await call.read(), await call.read()]
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() is grpc.StatusCode.OK
    assert answers == [b"request 0", b"end 0", b"request 1", b"end 1", b"request 2", b"end 2"]
    assert served.model.grpc.completed == 1


async def test_echo_carries_a_16_mib_message(serve: Serve) -> None:
    """A 16 MiB message (four times grpcio's default receive limit) comes back whole."""
    served = await serve()
    message = bytes(range(256)) * (16 * 2**20 // 256)
    assert await served.channel.unary_unary(served.raw("Echo"))(message) == message


async def test_stats_expose_the_grpc_counters(serve: Serve) -> None:
    """/stats, the fake model's black-box counters, carries the gRPC calls' under "grpc"."""
    served = await serve(interval_ms=1)
    [r async for r in served.engine.Generate(_generate("g", 2))]
    async with aiohttp.ClientSession() as session, session.get(f"{served.model.url}/stats") as resp:
        counters = (await resp.json())["grpc"]
    assert counters == {
        "started": 1,
        "completed": 1,
        "cancelled": 0,
        "aborted": 0,
        "shutdown_aborted": 0,
        "failed": 0,
        "active": 0,
        "cancellations": [],
    }


async def test_a_port_in_use_is_refused(serve: Serve) -> None:
    """A second endpoint on a port in use fails to bind (OSError: the CLI's "cannot listen", exit 2)
    instead of sharing the port through SO_REUSEPORT, grpcio's default."""
    served = await serve()
    second = grpc_server.GrpcEndpoint(fake_model.Settings(), fake_model.State())
    with pytest.raises(OSError, match=r"gRPC on 127\.0\.0\.1"):
        await second.start("127.0.0.1", served.model.grpc_port)
    await second.stop(0)


# -- SIGTERM with vLLM's --shutdown-timeout, on a real process. --------------------------------------


class ModelProcess:
    """``drain-router-dev fake-model --grpc-port 0`` as a child process, and the events it logged."""

    def __init__(self, *args: str) -> None:
        argv = [sys.executable, "-m", "drain_router_dev", "fake-model", "--port", "0", "--grpc-port", "0", *args]
        self.proc = process_.Process("fake-model", argv, log_path("fake-model"))
        self.events: list[dict[str, Any]] = []

    async def event(self, name: str, timeout: float = 20) -> dict[str, Any]:
        """The first ``name`` event, once logged."""

        def logged() -> dict[str, Any] | None:
            exited = not self.proc.alive
            for line in self.proc.new_lines():
                with contextlib.suppress(ValueError):
                    self.events.append(json.loads(line))
            found = [e for e in self.events if e.get("event") == name]
            if not found and exited:
                raise self.proc.failed(f"exited without a {name} event")
            return found[0] if found else None

        event: dict[str, Any] = await wait_until(logged, timeout, f"a {name} event")
        return event


@pytest.fixture
async def model_process() -> AsyncIterator[Callable[..., Awaitable[tuple[ModelProcess, Any]]]]:
    """``await model_process(*args)``: a listening fake model process and a channel to its gRPC port."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*args: str) -> tuple[ModelProcess, Any]:
            model = ModelProcess(*args)
            model.proc.start()
            stack.callback(model.proc.kill)
            listening = await model.event("fake_model.listening")
            target = f"127.0.0.1:{listening['grpc_port']}"
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            return model, channel

        yield start


async def _http_stats(model: ModelProcess) -> dict[str, Any]:
    port = (await model.event("fake_model.listening"))["port"]
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/stats") as resp:
        stats: dict[str, Any] = await resp.json()
        return stats


@pytest.mark.slow
async def test_sigterm_lets_a_grpc_call_finish_within_the_timeout(model_process: Any) -> None:
    """1. a Generate of 25 tokens, 20 ms apart, runs; a grpc.health Watch is open 2. SIGTERM
    (--shutdown-timeout 10). Result: health turns NOT_SERVING; new calls are refused; the Generate
    still streams every token; the process exits 0 once it ended, long before the timeout."""
    model, channel = await model_process("--shutdown-timeout", "10", "--interval-ms", "20")
    engine, health = pb_grpc.VllmEngineStub(channel), health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=grpc_engine.SERVICE))
    assert (await watch.read()).status == SERVING
    call = engine.Generate(_generate("drained", 25))
    first = await call.read()
    assert (await _http_stats(model))["grpc"]["active"] == 1
    signalled = time.monotonic()
    model.proc.signal(signal.SIGTERM)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await engine.HealthCheck(pb.HealthCheckRequest())
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    rest = await _rest(call)
    assert _tokens([first, *rest]) == list(range(25))
    assert rest[-1].complete.finish_reason == "length"
    assert await model.proc.wait_exit(10) == 0
    assert time.monotonic() - signalled < 5, "the shutdown waited past the end of the last call"
    assert (await model.event("fake_model.stopping"))["grpc_active"] == 1, "the call had ended before SIGTERM"
    stopped = (await model.event("fake_model.stopped"))["grpc"]
    assert (stopped["completed"], stopped["shutdown_aborted"], stopped["cancelled"]) == (1, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("timeout", [0.0, 0.5], ids=["zero-aborts-at-once", "deadline"])
async def test_sigterm_aborts_a_grpc_call_past_the_timeout(model_process: Any, timeout: float) -> None:
    """1. a Generate of 1000 tokens, 20 ms apart, runs 2. SIGTERM (--shutdown-timeout 0 or 0.5).
    Result: at the timeout the call ends UNAVAILABLE, short of its tokens, counted as aborted by the
    shutdown (not as a client's cancel); the process exits 0."""
    model, channel = await model_process("--shutdown-timeout", str(timeout), "--interval-ms", "20")
    call = pb_grpc.VllmEngineStub(channel).Generate(_generate("cut", 1000))
    await call.read()
    signalled = time.monotonic()
    model.proc.signal(signal.SIGTERM)
    with pytest.raises(grpc.aio.AioRpcError) as aborted:
        await _rest(call)
    took = time.monotonic() - signalled
    assert aborted.value.code() is grpc.StatusCode.UNAVAILABLE
    assert timeout <= took < timeout + 1.5, took
    assert await model.proc.wait_exit(10) == 0
    stopped = (await model.event("fake_model.stopped"))["grpc"]
    assert (stopped["shutdown_aborted"], stopped["cancelled"], stopped["completed"]) == (1, 0, 0)
