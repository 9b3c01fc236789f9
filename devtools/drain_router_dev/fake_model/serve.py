"""``drain-router-dev fake-model``: the process, its signals, and a shutdown with vLLM's semantics.

On SIGTERM (or SIGINT) with ``--shutdown-timeout-secs N`` it does what ``vllm serve
--shutdown-timeout N`` does (vLLM PR #34730, in v0.18.0): it stops accepting at once (the listener
is closed, idle keep-alive connections are closed, a busy one closes after its response), lets the
completions in flight finish for up to N seconds, aborts those still running at that deadline, and
exits 0. Realtime sessions (``/v1/realtime``) open at the deadline get a Close frame with code 1001
(Going Away), as a well-behaved WebSocket server sends when it goes down. N = 0 is vLLM's default: in-flight completions are aborted at once. ``--exit-on-sigterm``
is a server with no handler at all: the signal kills it.

aiohttp's own ``shutdown_timeout`` is not used for the wait: it treats 0 as "wait forever", rounds
deadlines above 5 s up to a whole second and may apply the timeout twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

import click
from aiohttp import web

from drain_router_dev.fake_model import app as fake_app
from drain_router_dev.fake_model import openai
from drain_router_dev.fake_model import state as fake_state
from drain_router_dev.options import field_option

#: After the deadline's aborts, how long the aborted handlers get to unwind (they do at once).
UNWIND_SECS = 1.0


async def shut_down(runner: web.BaseRunner, state: fake_state.State, timeout: float) -> int:
    """Stop accepting, wait up to ``timeout`` s for the completions and realtime sessions in flight,
    close the sessions still open with 1001 (Going Away), abort the completions still running.

    Returns how many completions were aborted. ``timeout`` 0 aborts (and closes) at once.
    """
    state.shutting_down = True
    for site in list(runner.sites):
        await site.stop()  # the listener is closed: new connections are refused
    server = runner.server
    assert server is not None
    await asyncio.sleep(0)  # requests accepted just before the close start being handled
    server.pre_shutdown()  # every connection closes after its current response...
    for connection in server.connections:
        if connection not in state.busy:
            connection.force_close()  # ...and an idle keep-alive one now (pre_shutdown leaves it open)
    running = set(state.inflight) | set(state.sessions.values())
    if running and timeout > 0:
        await asyncio.wait(running, timeout=timeout)
    # Realtime sessions still open at the deadline end with a Close 1001 (Going Away), so their
    # clients know to reconnect, rather than with a cut connection.
    await fake_app.close_sessions(state)
    left = [task for task in state.inflight if not task.done()]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=UNWIND_SECS)
    await runner.cleanup()
    return len(left)


async def serve(
    settings: openai.Settings,
    *,
    host: str,
    port: int,
    uds: str | None,
    grpc_port: int | None = None,
    exit_on_sigterm: bool,
    shutdown_timeout: float,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if exit_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # no handler: the signal kills the process
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)  # as vLLM: SIGINT is handled like SIGTERM

    state = fake_state.State()
    runner = web.AppRunner(
        fake_app.make_app(settings, state), handler_cancellation=True, access_log=None, shutdown_timeout=UNWIND_SECS
    )
    await runner.setup()
    site = web.UnixSite(runner, uds) if uds else web.TCPSite(runner, host, port)
    await site.start()
    address: dict[str, Any] = {"uds": uds} if uds else {"host": host, "port": runner.addresses[0][1]}
    grpc_endpoint = None
    if grpc_port is not None:
        from drain_router_dev.fake_model import (
            grpc_server,
        )  # grpcio: the devtools distribution's dependencies, loaded only if asked

        grpc_endpoint = grpc_server.GrpcEndpoint(settings, state)
        address["grpc_port"] = await grpc_endpoint.start(host, grpc_port)
    _log(
        "fake_model.listening",
        **address,
        chunks=settings.chunks,
        interval_ms=settings.interval_ms,
        first_token_ms=settings.first_token_ms,
        batch_size=settings.batch_size,
        ignore_continue_final_message=settings.ignore_continue_final_message,
        exit_on_sigterm=exit_on_sigterm,
        shutdown_timeout_secs=shutdown_timeout,
    )
    try:
        await stop.wait()
    finally:
        _log(
            "fake_model.stopping",
            active=state.active,
            grpc_active=state.grpc.active,
            shutdown_timeout_secs=shutdown_timeout,
        )
        grpc_stopped = None if grpc_endpoint is None else asyncio.create_task(grpc_endpoint.stop(shutdown_timeout))
        aborted = await shut_down(runner, state, shutdown_timeout)  # the HTTP side, meanwhile
        if grpc_stopped is not None:
            await grpc_stopped
        _log("fake_model.stopped", aborted=aborted, **state.stats())


def _log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "ts": round(time.time(), 3), **fields}), flush=True)


@click.command("fake-model")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="ADDRESS", help="Listen address.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Listen port; 0 picks a free one (printed in the 'fake_model.listening' line).",
)
@click.option("--uds", default=None, metavar="PATH", help="Listen on this Unix socket instead of TCP.")
@click.option(
    "--grpc-port",
    default=None,
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Also serve gRPC on --host and this port: vLLM's engine service (vllm.grpc.engine.VllmEngine), "
    "grpc.health.v1 and a Triton-shaped raw-bytes service; 0 picks a free one (printed as grpc_port in the "
    "'fake_model.listening' line). Unset: no gRPC. Needs the devtools distribution's dependencies.",
)
@field_option(
    openai.Settings,
    "chunks",
    type=click.IntRange(0, openai.MAX_CHUNKS),
    metavar="N",
    help="Chunks (tokens) per completion; a request's 'chunks', 'max_completion_tokens' or 'max_tokens' overrides it.",
)
@field_option(
    openai.Settings,
    "interval_ms",
    type=click.IntRange(0, openai.MAX_INTERVAL_MS),
    metavar="MS",
    help="Milliseconds between chunks.",
)
@field_option(
    openai.Settings,
    "first_token_ms",
    type=click.IntRange(0, openai.MAX_INTERVAL_MS),
    metavar="MS",
    help="Silent milliseconds before the first chunk.",
)
@field_option(openai.Settings, "model", metavar="NAME", help="Model name in answers.")
@field_option(
    openai.Settings,
    "batch_size",
    type=click.IntRange(0),
    metavar="B",
    help="The engine's capacity, as continuous batching: with k completions generating at once (their "
    "prefill included), each one's time per token is interval-ms * max(1, k / B), recomputed as streams "
    "start and end, so past B streams every stream slows and the total token rate stays at B per "
    "interval, as on a GPU. 0: no limit (every stream keeps interval-ms). gRPC and realtime "
    "answers keep interval-ms.",
)
@field_option(
    openai.Settings,
    "ignore_continue_final_message",
    is_flag=True,
    help="Behave as llama-cpp-python's server: ignore a chat's continue_final_message (and "
    "add_generation_prompt) and answer every chat with a new turn from t0. Unset: vLLM's semantics "
    "(continue the final message; 400 when both are true).",
)
@click.option(
    "--shutdown-timeout-secs",
    "--shutdown-timeout",
    "shutdown_timeout_secs",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0),
    metavar="SECS",
    help="vLLM's --shutdown-timeout: on SIGTERM stop accepting at once (listener and idle keep-alive "
    "connections closed), let in-flight completions finish for up to this many seconds, abort the rest, "
    "exit 0. 0 aborts in-flight completions at once (vLLM's default).",
)
@click.option(
    "--exit-on-sigterm",
    is_flag=True,
    default=False,
    help="No SIGTERM handler: the signal kills the process and cuts every stream (a server that does not drain).",
)
def command(
    host: str,
    port: int,
    uds: str | None,
    grpc_port: int | None,
    chunks: int,
    interval_ms: int,
    first_token_ms: int,
    model: str,
    batch_size: int,
    ignore_continue_final_message: bool,
    shutdown_timeout_secs: float,
    exit_on_sigterm: bool,
) -> None:
    """A stand-in OpenAI-compatible streaming model server, for demos and tests.

    POST /v1/completions and /v1/chat/completions ("stream": true for server-sent events, each
    chunk numbered by "seq", ending "data: [DONE]"); GET /v1/realtime (a WebSocket session with
    OpenAI-Realtime-shaped events: response.create is answered with numbered response.text.delta
    events, then response.done); GET /health; GET /stats (started, finished, cancelled, active,
    max_active: the peak of active, sessions, and the gRPC calls). With --batch-size B, completions
    share the engine's capacity: past B at once, each stream's tokens come slower. With --grpc-port, gRPC too: vLLM's engine service (Generate streams
    numbered tokens, Abort, HealthCheck), grpc.health.v1, and a Triton-shaped raw-bytes service
    (inference.GRPCInferenceService: ModelStreamInfer, Echo).
    It generates nothing real: it paces numbered chunks, the tokens " t0", " t1", ... (ids 1000, 1001,
    ...), resumed after the t<k> that ends the prompt (or, with continue_final_message, the final
    chat message), so a continuation's text is the rest of the whole answer.

    \b
    On SIGTERM or SIGINT it shuts down as `vllm serve --shutdown-timeout N` does:
      1. stop accepting: the listener closes, idle keep-alive connections close;
         gRPC health turns NOT_SERVING, then every gRPC connection gets a GOAWAY;
      2. in-flight completions and gRPC calls finish, for up to N s (--shutdown-timeout-secs);
      3. those still running at the deadline are aborted, open realtime sessions
         get a Close 1001 (Going Away); exit 0.
    """
    settings = openai.Settings(
        chunks=chunks,
        interval_ms=interval_ms,
        first_token_ms=first_token_ms,
        model=model,
        batch_size=batch_size,
        ignore_continue_final_message=ignore_continue_final_message,
    )
    try:
        asyncio.run(
            serve(
                settings,
                host=host,
                port=port,
                uds=uds,
                grpc_port=grpc_port,
                exit_on_sigterm=exit_on_sigterm,
                shutdown_timeout=shutdown_timeout_secs,
            )
        )
    except OSError as exc:
        click.echo(f"fake-model: cannot listen: {exc}", err=True)
        sys.exit(2)
    except ImportError as exc:  # --grpc-port without grpcio
        click.echo(
            f"fake-model: --grpc-port needs the devtools distribution's dependencies (pip install ./devtools): {exc}",
            err=True,
        )
        sys.exit(2)
