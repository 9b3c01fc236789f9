"""The fake model server in the test's own event loop, like ``kopf.testing``: the same application
as ``drain-router-dev fake-model`` (:func:`app.make_app`), started on a loopback port or a Unix socket.

    async with testing.running() as model:
        ...  # send to model.url; read model.started, model.cancelled; set model.healthy = False

    async with testing.running(grpc=True) as model:
        ...  # also gRPC at model.grpc_target; its calls counted in model.grpc
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from drain_router_dev.fake_model import app, openai, state


@dataclasses.dataclass(slots=True, eq=False)
class FakeModel(state.State):
    """A running in-process fake model: its :class:`state.State` plus where it listens."""

    url: str = ""
    """``http://127.0.0.1:PORT``, or ``unix:/path`` (the router's upstream syntax)."""
    port: int = 0
    grpc_target: str = ""
    """``127.0.0.1:PORT`` of the gRPC endpoint (a grpcio channel's target), if it was asked for."""
    grpc_port: int = 0


@asynccontextmanager
async def running(
    settings: openai.Settings | None = None, *, unix_path: Path | None = None, grpc: bool = False
) -> AsyncIterator[FakeModel]:
    """The fake model in this loop; with ``grpc``, its gRPC endpoint too (on loopback; grpcio needed).
    On exit the gRPC calls still running are cancelled at once (``--shutdown-timeout 0``)."""
    model = FakeModel()
    settings = settings or openai.Settings()
    runner = web.AppRunner(app.make_app(settings, model), handler_cancellation=True, access_log=None)
    await runner.setup()
    async with _grpc_endpoint(settings, model, grpc):
        try:
            if unix_path is not None:
                await web.UnixSite(runner, str(unix_path)).start()
                model.url = f"unix:{unix_path}"
            else:
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                model.port = runner.addresses[0][1]
                model.url = f"http://127.0.0.1:{model.port}"
            yield model
        finally:
            model.shutting_down = True
            await app.close_sessions(model)  # 1001, as the CLI's shutdown does, not a cut connection
            await runner.cleanup()


@asynccontextmanager
async def _grpc_endpoint(settings: openai.Settings, model: FakeModel, wanted: bool) -> AsyncIterator[None]:
    """The gRPC endpoint on a loopback port while the block runs, if ``wanted``."""
    if not wanted:
        yield
        return
    from drain_router_dev.fake_model import (
        grpc_server,
    )  # grpcio: the devtools distribution's dependencies, loaded only if asked

    endpoint = grpc_server.GrpcEndpoint(settings, model)
    model.grpc_port = await endpoint.start("127.0.0.1", 0)
    model.grpc_target = f"127.0.0.1:{model.grpc_port}"
    try:
        yield
    finally:
        await endpoint.stop(0)


def sse_events(body: bytes) -> list[str]:
    """The ``data:`` payloads of a server-sent events body, in order."""
    return [line[len("data: ") :] for line in body.decode().split("\n") if line.startswith("data: ")]
