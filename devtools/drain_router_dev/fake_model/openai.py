"""The OpenAI shapes the fake model answers with, and what a request asks it to generate. Pure."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

#: Upper bounds for per-request overrides: a typo must not tie the server up for a day.
MAX_CHUNKS = 100_000
MAX_INTERVAL_MS = 60_000

DEFAULT_CHUNKS = 16
DEFAULT_INTERVAL_MS = 50


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    chunks: int = DEFAULT_CHUNKS
    """Tokens (stream chunks) per completion, when the request does not say."""
    interval_ms: int = DEFAULT_INTERVAL_MS
    """Milliseconds between two chunks: the "decode" speed."""
    first_token_ms: int = 0
    """Milliseconds of silence before the first chunk: the "prefill"."""
    model: str = "fake-model"
    """The model name reported in answers."""
    batch_size: int = 0
    """The engine's capacity in streams (continuous batching, :mod:`.capacity`): with ``k``
    completions generating at once, each one's token interval is ``interval_ms * max(1, k /
    batch_size)``. 0: no limit, every stream keeps ``interval_ms``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Generation:
    chunks: int
    interval_ms: int
    first_token_ms: int
    stream: bool
    chat: bool


def bad_request(error: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": error}), content_type="application/json")


def _int_param(name: str, raw: object, maximum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise bad_request(f"{name} must be a whole number")
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be a whole number") from None
    if not 0 <= value <= maximum:
        raise bad_request(f"{name} must be between 0 and {maximum}")
    return value


def resolve(settings: Settings, body: Mapping[str, Any], query: Mapping[str, Any], *, chat: bool) -> Generation:
    """The generation a request asks for: query parameter > JSON field > server default."""

    def pick(name: str, default: int, maximum: int, *aliases: str) -> int:
        for source in (query, body):
            for key in (name, *aliases):
                if key in source and source[key] is not None:
                    return _int_param(key, source[key], maximum)
        return default

    return Generation(
        chunks=pick("chunks", settings.chunks, MAX_CHUNKS, "max_tokens"),
        interval_ms=pick("interval_ms", settings.interval_ms, MAX_INTERVAL_MS),
        first_token_ms=pick("first_token_ms", settings.first_token_ms, MAX_INTERVAL_MS),
        stream=bool(body.get("stream", False)),
        chat=chat,
    )


def chunk_payload(gen: Generation, *, rid: str, created: int, model: str, seq: int) -> dict[str, Any]:
    """One streamed chunk in the OpenAI shape, plus ``seq``/``total`` so losses are detectable."""
    last = seq == gen.chunks - 1
    text = f" tok{seq}"
    finish = "length" if last else None
    if gen.chat:
        delta: dict[str, Any] = {"content": text, **({"role": "assistant"} if seq == 0 else {})}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    obj = "chat.completion.chunk" if gen.chat else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "seq": seq,
        "total": gen.chunks,
    }


def full_payload(gen: Generation, *, rid: str, created: int, model: str) -> dict[str, Any]:
    text = "".join(f" tok{i}" for i in range(gen.chunks))
    if gen.chat:
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "length"}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    return {
        "id": rid,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 0, "completion_tokens": gen.chunks, "total_tokens": gen.chunks},
    }
