"""The front's test rig: real processes only. Fake model servers (``drain-router-dev fake-model``, the
vLLM continuation dialect: token k is " t<k>", so a continued answer can be compared with the
uninterrupted one), a real ``drain-router serve`` in front of each (a pod), and a real
``drain-router front --pods`` in front of them, each waited for by the event it logs.

    async with Rig() as rig:
        pod = await rig.pod()                 # a model server and its router
        front = await rig.front(pod, ...)     # extra front flags as keyword arguments
        events = await stream(front, "/v1/completions", {...})
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from drain_router_dev import process as process_
from tests.blackbox import metric_samples
from tests.process import RouterProcess, log_path


class ModelProcess:
    """``drain-router-dev fake-model --port 0`` and the events it logged."""

    def __init__(self, *args: str) -> None:
        argv = [sys.executable, "-m", "drain_router_dev", "fake-model", "--port", "0", *args]
        self.proc = process_.Process("fake-model", argv, log_path("fake-model"))
        self.events: list[dict[str, Any]] = []
        self.port = 0

    async def start(self) -> ModelProcess:
        self.proc.start()

        def listening() -> dict[str, Any] | None:
            for line in self.proc.new_lines():
                with contextlib.suppress(ValueError):
                    self.events.append(json.loads(line))
            found = [e for e in self.events if e.get("event") == "fake_model.listening"]
            if not found and not self.proc.alive:
                raise self.proc.failed("exited without listening")
            return found[0] if found else None

        event: dict[str, Any] = await process_.wait_until(listening, 20, "the fake model listening")
        self.port = int(event["port"])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclasses.dataclass
class Pod:
    model: ModelProcess
    router: RouterProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"


class Rig:
    """Every process it started is killed on exit."""

    def __init__(self) -> None:
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Rig:
        await self.stack.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stack.__aexit__(*exc)

    async def model(self, *args: str) -> ModelProcess:
        model = ModelProcess(*args)
        self.stack.callback(model.proc.kill)
        return await model.start()

    async def router(self, upstream: str, *args: str, drain_secs: str = "0") -> RouterProcess:
        router = await RouterProcess.start("--upstream", upstream, "--shutdown-drain-secs", drain_secs, *args)
        self.stack.push_async_callback(router.kill)
        await router.wait_event("startup.listening")
        return router

    async def pod(self, *router_args: str, model_args: tuple[str, ...] = (), drain_secs: str = "0") -> Pod:
        model = await self.model(*model_args)
        return Pod(model, await self.router(model.url, *router_args, drain_secs=drain_secs))

    async def front(
        self, *pods: Pod | str, ready: int | None = None, env: dict[str, str] | None = None, **flags: Any
    ) -> RouterProcess:
        """``drain-router front --pods ...`` with ``flags`` (``max_continuations=1`` is
        ``--max-continuations 1``), once it listens and has ``ready`` pods ready (all by default)."""
        urls = [p if isinstance(p, str) else p.url for p in pods]
        argv = [
            sys.executable,
            "-m",
            "drain_router",
            "front",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            "0",
            "--pods",
            ",".join(urls),
        ]
        flags.setdefault("poll_interval_secs", 0.1)
        flags.setdefault("shutdown_drain_secs", 0)
        for name, value in flags.items():
            flag = f"--{name.replace('_', '-')}"
            argv += [flag] if value is True else [flag, str(value)]
        proc = process_.Process("front", argv, log_path("front"), env=env)
        proc.start()
        front = RouterProcess(proc)
        self.stack.push_async_callback(front.kill)
        await front.wait_event("startup.listening")
        want = len(urls) if ready is None else ready
        if want:
            await wait_metric(front, "drain_router_front_ready_pods", want)
        return front


async def metric(proc: RouterProcess, name: str, **labels: str) -> float:
    assert proc.admin_port is not None
    samples = await metric_samples(proc.admin_port, name)
    return samples.get(tuple(sorted(labels.items())), 0.0)


async def wait_metric(proc: RouterProcess, name: str, value: float, timeout: float = 10.0, **labels: str) -> None:
    await process_.wait_until(
        lambda: metric(proc, name, **labels), timeout, f"{name}{labels or ''} == {value}", until=lambda v: v == value
    )


@dataclasses.dataclass
class Streamed:
    status: int
    headers: dict[str, str]
    raw: bytes
    """The body as received."""
    cut: bool = False
    """The body ended before its end (the connection was cut)."""

    @property
    def events(self) -> list[str]:
        """Each event's data, as an SSE client reads it."""
        out = []
        for block in self.raw.replace(b"\r\n", b"\n").split(b"\n\n"):
            lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines).decode())
        return out

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    def text(self) -> str:
        parts = []
        for chunk in self.chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta")
                parts.append((delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or ""))
        return "".join(parts)


async def post(port: int, path: str, body: dict[str, Any], *, started: Any = None) -> Streamed:
    """POST ``body`` and read the whole answer; ``started`` (an ``asyncio.Event``) is set once the
    answer's first body bytes arrived."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"http://127.0.0.1:{port}{path}", json=body) as resp,
    ):
        raw = b""
        async for data in resp.content.iter_any():
            raw += data
            if started is not None:
                started.set()
        return Streamed(resp.status, dict(resp.headers), raw)


class ShortEngine:
    """An engine that streams the fake model's first ``tokens`` tokens (or the ``events`` given) and
    ends its stream there, cleanly and without ``[DONE]`` unless ``done`` (the router in front of it
    then sends its ``upstream_truncated`` event); ``POST /v1/completions`` and
    ``/v1/chat/completions``, nothing else."""

    def __init__(self, tokens: int, events: list[dict[str, Any]] | None = None, done: bool = False) -> None:
        self.events = events or [
            {
                "id": "cmpl-short",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": None}],
            }
            for k in range(tokens)
        ]
        self.done = done
        self.served = 0
        self.url = ""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.served += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in self.events:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if self.done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def short_engine(
    tokens: int, events: list[dict[str, Any]] | None = None, *, done: bool = False
) -> AsyncIterator[ShortEngine]:
    engine = ShortEngine(tokens, events, done)
    app = web.Application()
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_post("/v1/chat/completions", engine.completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield engine
    finally:
        await runner.cleanup()


def sequence(start: int, count: int) -> str:
    """The fake model's answer from token ``start``: " t<start> t<start+1> ..."."""
    return "".join(f" t{k}" for k in range(start, start + count))
