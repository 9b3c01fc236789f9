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

import asyncio
import contextlib
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
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

    async def pods(self, count: int, *router_args: str) -> list[Pod]:
        """``count`` pods, started at once."""
        return list(await asyncio.gather(*(self.pod(*router_args) for _ in range(count))))

    async def stand_in(self, host: str = "127.0.0.1", port: int = 0) -> StandIn:
        """A :class:`StandIn` pod listening on ``host`` (``port`` 0: a free one), closed on exit."""
        pod = StandIn()
        self.stack.push_async_callback(pod.close)
        await pod.start(host, port)
        return pod

    async def front(
        self, *pods: Pod | StandIn | str, ready: int | None = None, env: dict[str, str] | None = None, **flags: Any
    ) -> RouterProcess:
        """``drain-router front --pods ...`` with ``flags`` (``max_continuations=1`` is
        ``--max-continuations 1``; with no pods, ``service=...`` and ``kube_api=...`` instead), once
        it listens and has ``ready`` pods ready (all by default)."""
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
        ]
        if urls:
            argv += ["--pods", ",".join(urls)]
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


async def model_stats(model: ModelProcess) -> dict[str, Any]:
    """The fake model's ``/stats``: ``started``, ``active``, ..."""
    async with aiohttp.ClientSession() as session, session.get(model.url + "/stats") as resp:
        stats: dict[str, Any] = await resp.json()
        return stats


# -- stand-in pods: a pod's router played by the test, byte for byte ------------------------------


@dataclasses.dataclass
class Seen:
    """One request as it reached a stand-in pod."""

    method: str
    target: str
    headers: dict[str, str]
    """Names lowercased."""
    body: bytes


Answer = Callable[[asyncio.StreamWriter], Awaitable[bool]]
"""Writes one answer's bytes (draining as it goes); returns whether the connection is kept for the
next request (False: it is closed)."""


def answer(status: int, headers: tuple[tuple[str, str], ...] = (), body: bytes = b"") -> Answer:
    """A whole answer with a Content-Length, its connection kept."""

    async def write(writer: asyncio.StreamWriter) -> bool:
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        writer.write(f"HTTP/1.1 {status} X\r\n{lines}content-length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        return True

    return write


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def completion_event(k: int, *, finish: str | None = None) -> bytes:
    """The fake model's k-th completions chunk (token " t<k>") as one event."""
    event = {
        "id": "cmpl-standin",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def event_stream(*events: bytes) -> Answer:
    """A chunked event stream, one chunk an event, then its last chunk: an honest end."""

    async def write(writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n")
        await writer.drain()
        return True

    return write


GOOD_STREAM = (completion_event(0), completion_event(1, finish="length"), DONE)
"""A short whole answer: what a stand-in answers once its scripted answers are used up."""


class StandIn:
    """A pod's router played by the test over raw sockets: ``GET /readyz`` answers 200 (503 while
    :attr:`ready` is False); every other request is recorded in :attr:`seen` and answered by the
    next of :attr:`answers`, or :attr:`default` once they are used up. Keep-alive as the answers
    say."""

    def __init__(self) -> None:
        self.ready = True
        self.answers: list[Answer] = []
        self.default: Answer = event_stream(*GOOD_STREAM)
        self.seen: list[Seen] = []
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)
        self.url = f"http://{host}:{self.server.sockets[0].getsockname()[1]}"

    async def stop_listening(self) -> None:
        """New connections are refused from now on (the connections open go on)."""
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def close(self) -> None:
        """Every connection cut, and its task ended (an answer still writing, or waiting, stopped)."""
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if target == "/readyz":
                    status = b"200 OK" if self.ready else b"503 Service Unavailable"
                    writer.write(b"HTTP/1.1 %s\r\ncontent-length: 0\r\n\r\n" % status)
                    continue
                self.seen.append(Seen(method, target, headers, body))
                write = self.answers.pop(0) if self.answers else self.default
                if not await write(writer):
                    writer.close()
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # (closed: ended here, so that asyncio's server does not log the task as cancelled)
        finally:
            self.tasks.discard(task)
            self.writers.discard(writer)
            if not writer.is_closing():
                writer.transport.abort()
