"""The OpenAI shapes the fake model answers with, and what a request asks it to generate. Pure.

What it "generates" is one fixed sequence that a continuation resumes: token ``k`` is the text
`` t<k>`` (a leading space) with id ``1000 + k``. A request generates ``chunks`` tokens, from the
one after the ``t<k>`` that ends its context (else from ``t0``), so an answer cut after ``t3`` and
continued with its text so far gives ``t4``, ``t5``, ...: byte for byte the rest of the whole
answer. The context (:func:`resolve`) is a completions prompt (its text, or its token ids), or the
final chat message when ``continue_final_message`` is honoured; a chat without it is a new turn.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

from aiohttp import web

#: Upper bounds for per-request overrides: a typo must not tie the server up for a day.
MAX_CHUNKS = 100_000
MAX_INTERVAL_MS = 60_000

DEFAULT_CHUNKS = 16
DEFAULT_INTERVAL_MS = 50

TOKEN_ID_BASE = 1000
"""Token ``k``'s id is ``TOKEN_ID_BASE + k``; any other prompt word's id is below it (100..999)."""

_SEQUENCE_WORD = re.compile(r"t(0|[1-9][0-9]*)")
_ENDS_WITH_SEQUENCE_WORD = re.compile(r"(?:\A|\s)t(0|[1-9][0-9]*)\Z")


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
    ignore_continue_final_message: bool = False
    """Chat's ``continue_final_message`` and ``add_generation_prompt`` are ignored, as
    llama-cpp-python's server does: every chat is a new turn from ``t0``. False: vLLM's semantics."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    chunks: int
    """Tokens this request generates."""
    interval_ms: int
    first_token_ms: int
    stream: bool
    chat: bool
    start: int = 0
    """The first generated token's ``k``."""
    prompt_ids: tuple[int, ...] = ()
    """The prompt as ids (:func:`word_id` of its words, or the ids it was given): its length is
    ``usage.prompt_tokens``."""
    role: str = "assistant"
    """A chat answer's role (its first chunk's delta): the continued message's own when continuing."""
    token_ids: bool = False
    """``return_token_ids``: each chunk's ``token_ids``, the prompt's ``prompt_token_ids`` first."""
    usage: bool = False
    """``stream_options.include_usage``: a last chunk with ``choices: []`` and ``usage``."""

    @property
    def events(self) -> int:
        """The chunks a stream sends: chat's role chunk, one per token, the usage chunk if asked."""
        return int(self.chat) + self.chunks + int(self.usage)

    def usage_numbers(self) -> dict[str, int]:
        prompt = len(self.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": self.chunks, "total_tokens": prompt + self.chunks}


def token_text(k: int) -> str:
    return f" t{k}"


def word_id(word: str) -> int:
    """A prompt word's id: ``t<k>`` is ``TOKEN_ID_BASE + k``, any other word a stable hash in 100..999."""
    match = _SEQUENCE_WORD.fullmatch(word)
    if match:
        return TOKEN_ID_BASE + int(match.group(1))
    return 100 + zlib.crc32(word.encode()) % 900


def text_ids(text: str) -> list[int]:
    """A text's ids: one per whitespace-separated word (:func:`word_id`)."""
    return [word_id(word) for word in text.split()]


def resume_after_text(text: str) -> int:
    """Where the sequence resumes after ``text``: one past the ``t<k>`` word that ends it, else 0."""
    match = _ENDS_WITH_SEQUENCE_WORD.search(text)
    return int(match.group(1)) + 1 if match else 0


def resume_after_ids(ids: list[int]) -> int:
    """Where the sequence resumes after ``ids``: one past the last id when it is a token's, else 0."""
    return ids[-1] - TOKEN_ID_BASE + 1 if ids and ids[-1] >= TOKEN_ID_BASE else 0


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


def _is_ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _message_text(message: Any) -> str:
    """A chat message's text: its string content, or its text parts joined."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _completions_context(body: Mapping[str, Any]) -> tuple[int, tuple[int, ...]]:
    """A completions prompt's resume point and ids: a string, or a list of token ids (any other
    prompt is no context)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return resume_after_text(prompt), tuple(text_ids(prompt))
    if _is_ids(prompt):
        return resume_after_ids(prompt), tuple(prompt)
    return 0, ()


def _chat_context(settings: Settings, body: Mapping[str, Any]) -> tuple[int, tuple[int, ...], str]:
    """A chat's resume point, ids (every message's words) and answer role. vLLM's semantics:
    ``continue_final_message`` continues the final message (its role is the answer's), and with
    ``add_generation_prompt`` (true unless set false) it is a 400."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    texts = [_message_text(m) for m in messages]
    ids = tuple(i for text in texts for i in text_ids(text))
    if settings.ignore_continue_final_message or not body.get("continue_final_message"):
        return 0, ids, "assistant"
    if body.get("add_generation_prompt", True):
        raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if not messages:
        return 0, ids, "assistant"
    last = messages[-1]
    role = last.get("role") if isinstance(last, dict) else None
    return resume_after_text(texts[-1]), ids, role if isinstance(role, str) else "assistant"


def resolve(settings: Settings, body: Mapping[str, Any], query: Mapping[str, Any], *, chat: bool) -> Generation:
    """The generation a request asks for: for its length and pace, query parameter > JSON field >
    server default (``chunks``, else ``max_completion_tokens``, else ``max_tokens``); where the
    sequence starts, from its context (the module's docstring)."""

    def pick(name: str, default: int, maximum: int, *aliases: str) -> int:
        for source in (query, body):
            for key in (name, *aliases):
                if key in source and source[key] is not None:
                    return _int_param(key, source[key], maximum)
        return default

    if chat:
        start, prompt_ids, role = _chat_context(settings, body)
    else:
        (start, prompt_ids), role = _completions_context(body), "assistant"
    options = body.get("stream_options")
    return Generation(
        chunks=pick("chunks", settings.chunks, MAX_CHUNKS, "max_completion_tokens", "max_tokens"),
        interval_ms=pick("interval_ms", settings.interval_ms, MAX_INTERVAL_MS),
        first_token_ms=pick("first_token_ms", settings.first_token_ms, MAX_INTERVAL_MS),
        stream=bool(body.get("stream", False)),
        chat=chat,
        start=start,
        prompt_ids=prompt_ids,
        role=role,
        token_ids=bool(body.get("return_token_ids")),
        usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


def stream_chunks(gen: Generation, *, rid: str, created: int, model: str) -> Iterator[tuple[bool, dict[str, Any]]]:
    """A stream's chunks in order, each with whether a token's pause comes before it (every token
    but the first), in vLLM's shapes: for chat a first chunk with the role only (``content: ""``),
    then one chunk per token (the last with ``finish_reason: "length"``), then the usage chunk if
    asked. With ``return_token_ids`` each token's choice has ``token_ids: [id]`` and the prompt's ids
    come first (completions: on the first token's choice; chat: on the role chunk, top level).

    Every chunk also carries ``seq`` (from 0) and ``total`` (:attr:`Generation.events`), so a client
    can tell a complete stream from one that lost chunks."""
    obj = "chat.completion.chunk" if gen.chat else "text_completion"
    seq = iter(range(gen.events))

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        head = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
        return {**head, **extra, "seq": next(seq), "total": gen.events}

    prompt_ids = {"prompt_token_ids": list(gen.prompt_ids)} if gen.token_ids else {}
    if gen.chat:
        role = {"index": 0, "delta": {"role": gen.role, "content": ""}, "finish_reason": None}
        yield False, chunk([role], **prompt_ids)
    for i in range(gen.chunks):
        k = gen.start + i
        finish = "length" if i == gen.chunks - 1 else None
        if gen.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": token_text(k)}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": token_text(k), "logprobs": None, "finish_reason": finish}
            if i == 0:
                choice.update(prompt_ids)
        if gen.token_ids:
            choice["token_ids"] = [TOKEN_ID_BASE + k]
        yield i > 0, chunk([choice])
    if gen.usage:
        yield False, chunk([], usage=gen.usage_numbers())


def full_payload(gen: Generation, *, rid: str, created: int, model: str) -> dict[str, Any]:
    """A non-streamed answer: the same tokens in one ``text`` or ``message``, and its usage."""
    text = "".join(token_text(gen.start + i) for i in range(gen.chunks))
    if gen.chat:
        message = {"role": gen.role, "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "length"}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    return {
        "id": rid,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": gen.usage_numbers(),
    }
