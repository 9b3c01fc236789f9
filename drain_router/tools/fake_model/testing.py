"""The fake model server in the test's own event loop, like ``kopf.testing``: the same application
as ``drain-router fake-model`` (:func:`app.make_app`), started on a loopback port or a Unix socket.

    async with testing.running() as model:
        ...  # send to model.url; read model.started, model.cancelled; set model.healthy = False
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from drain_router.tools.fake_model import app, openai, state


@dataclasses.dataclass(slots=True, eq=False)
class FakeModel(state.State):
    """A running in-process fake model: its :class:`state.State` plus where it listens."""

    url: str = ""
    """``http://127.0.0.1:PORT``, or ``unix:/path`` (the router's upstream syntax)."""
    port: int = 0


@asynccontextmanager
async def running(
    settings: openai.Settings | None = None, *, unix_path: Path | None = None
) -> AsyncIterator[FakeModel]:
    model = FakeModel()
    runner = web.AppRunner(
        app.make_app(settings or openai.Settings(), model), handler_cancellation=True, access_log=None
    )
    await runner.setup()
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


def sse_events(body: bytes) -> list[str]:
    """The ``data:`` payloads of a server-sent events body, in order."""
    return [line[len("data: ") :] for line in body.decode().split("\n") if line.startswith("data: ")]
