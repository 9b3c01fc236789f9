"""The fake model's continuation dialect, over HTTP: the sequence `` t0 t1 ...`` resumed after the
context's last ``t<k>``, vLLM's ``continue_final_message``, ``return_token_ids`` and
``stream_options.include_usage``, and llama-cpp-python's way of ignoring ``continue_final_message``.

The continuations are built by the front's own decisions (:func:`continuation.at_cut`) from a stream
cut after some of its events, and spliced by :func:`continuation.rewrite`: what a client of the
front would read must be the uninterrupted answer, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from click.testing import CliRunner

from drain_router.decisions import continuation as c
from drain_router_dev import fake_model, streams
from drain_router_dev.fake_model import serve as fake_serve

Client = Callable[..., Awaitable[TestClient]]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FLAGS = {"continue_final_message": True, "add_generation_prompt": False}


async def _serve(aiohttp_client: Client, **settings: Any) -> TestClient:
    app = fake_model.make_app(fake_model.Settings(chunks=3, interval_ms=0, **settings))
    return await aiohttp_client(app, server_kwargs={"handler_cancellation": True})


@pytest.fixture
async def client(aiohttp_client: Client) -> TestClient:
    return await _serve(aiohttp_client)


async def _chunks(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's chunks, once it ended with ``[DONE]`` and every chunk arrived (``seq``, ``total``)."""
    async with client.post(path, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        decoder = streams.SSEDecoder()
        events: list[str] = []
        async for data in resp.content.iter_any():
            events.extend(decoder.feed(data))
    assert streams.classify(streams.StreamResult(status=200, events=tuple(events))) is streams.Outcome.OK
    return [json.loads(event) for event in events[:-1]]


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        choice.get("text") or choice.get("delta", {}).get("content") or ""
        for chunk in chunks
        for choice in chunk["choices"]
    )


@pytest.mark.parametrize(
    ("path", "body", "text"),
    [
        pytest.param(COMPLETIONS, {"prompt": "Once upon"}, " t0 t1 t2", id="prompt-without-sequence"),
        pytest.param(COMPLETIONS, {"prompt": "Once t0 t1 t2 t3"}, " t4 t5 t6", id="prompt-text"),
        pytest.param(COMPLETIONS, {"prompt": "t11"}, " t12 t13 t14", id="prompt-only-a-token"),
        pytest.param(COMPLETIONS, {"prompt": "Once t3 upon"}, " t0 t1 t2", id="prompt-not-ending-with-one"),
        pytest.param(COMPLETIONS, {"prompt": "Once xt3"}, " t0 t1 t2", id="prompt-part-of-a-word"),
        pytest.param(COMPLETIONS, {"prompt": [7, 1000, 1001]}, " t2 t3 t4", id="prompt-ids"),
        pytest.param(COMPLETIONS, {"prompt": [1001, 7]}, " t0 t1 t2", id="prompt-ids-not-ending-with-one"),
        pytest.param(
            CHAT,
            {"messages": [{"role": "user", "content": "Hi t8"}, {"role": "assistant", "content": " t0 t1"}], **FLAGS},
            " t2 t3 t4",
            id="chat-continue-final-message",
        ),
        pytest.param(
            CHAT,
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " t0 t1"}]},
            " t0 t1 t2",
            id="chat-new-turn",
        ),
    ],
)
async def test_the_sequence_resumes_after_the_context(
    client: TestClient, path: str, body: dict[str, Any], text: str
) -> None:
    chunks = await _chunks(client, path, body)
    assert _text(chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


CASES = {
    "completions-text": (COMPLETIONS, {"prompt": "Once upon"}, c.Dialect.COMPLETIONS),
    "completions-token-ids": (COMPLETIONS, {"prompt": [5, 6, 7]}, c.Dialect.TOKEN_IDS),
    "chat": (CHAT, {"messages": [{"role": "user", "content": "Hi there"}]}, c.Dialect.CHAT),
    "chat-token-ids": (CHAT, {"messages": [{"role": "user", "content": "Hi there"}]}, c.Dialect.TOKEN_IDS),
}


@pytest.mark.parametrize("cut", [1, 4, 9])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_continuation_is_the_rest_of_the_answer(client: TestClient, case: str, cut: int) -> None:
    """1. a stream of 10 tokens (usage asked) 2. cut after ``cut`` tokens 3. the front's continuation,
    spliced. Result: the client's text and usage are the uninterrupted answer's, byte for byte."""
    path, body, dialect = CASES[case]
    body = {**body, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    request = c.assess(b"POST", path.encode(), json.dumps(body).encode(), dialect)
    assert isinstance(request, c.Continuable), request
    whole = await _chunks(client, path, request.first_body() or request.body)

    tracker, relayed = c.StreamTracker(request.api), []
    for chunk in whole:
        tracker.feed(json.dumps(chunk).encode())
        relayed.append(chunk)
        if len(tracker.parts) == cut:
            break
    decision = c.at_cut(request, tracker, continuations=0, max_continuations=1)
    assert decision.action is c.CutAction.CONTINUE and decision.request is not None, decision
    assert decision.request.by_token_ids is (dialect is c.Dialect.TOKEN_IDS)
    splice = c.Splice.start(request, tracker, decision.request)
    tracker.start_leg()
    for chunk in await _chunks(client, decision.request.path, decision.request.body):
        splice, out = c.rewrite(splice, chunk)
        assert out.action is not c.RewriteAction.ABANDON, chunk
        if out.action is c.RewriteAction.RELAY:
            relayed.append(json.loads(out.data))

    assert _text(relayed) == _text(whole) == "".join(f" t{k}" for k in range(10))
    assert relayed[-1]["usage"] == whole[-1]["usage"]


async def test_chat_continue_final_message_sends_the_role_delta_of_the_continued_message(client: TestClient) -> None:
    """vLLM's shape: the first chunk is a role delta with empty content, the continued message's role."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " t0"}]
    chunks = await _chunks(client, CHAT, {"messages": messages, **FLAGS})
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": " t1"},
        {"content": " t2"},
        {"content": " t3"},
    ]


@pytest.mark.parametrize(
    "flags",
    [{"continue_final_message": True, "add_generation_prompt": True}, {"continue_final_message": True}],
    ids=["both-true", "generation-prompt-by-default"],
)
async def test_continue_final_message_with_a_generation_prompt_is_400(
    client: TestClient, flags: dict[str, Any]
) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " t0"}]
    async with client.post(CHAT, json={"messages": messages, "stream": True, **flags}) as resp:
        assert resp.status == 400
        assert "continue_final_message" in (await resp.json())["error"]


@pytest.mark.parametrize("flags", [FLAGS, {"continue_final_message": True}], ids=["continue", "both-true"])
async def test_ignore_continue_final_message_starts_a_new_turn(aiohttp_client: Client, flags: dict[str, Any]) -> None:
    """llama-cpp-python's way: the flags are ignored (no 400 either); a role-only delta, then t0 on."""
    client = await _serve(aiohttp_client, ignore_continue_final_message=True)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " t0 t1"}]
    chunks = await _chunks(client, CHAT, {"messages": messages, **flags})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert _text(chunks) == " t0 t1 t2"


async def test_token_ids_on_completions(client: TestClient) -> None:
    """Each token's id on its choice (1000 + k); the prompt's ids on the first chunk's choice: a
    ``t<k>`` word is 1000 + k, another word a stable id in 100..999."""
    body = {"prompt": "Once t1 upon", "return_token_ids": True}
    chunks = await _chunks(client, COMPLETIONS, body)
    assert [chunk["choices"][0]["token_ids"] for chunk in chunks] == [[1000], [1001], [1002]]
    prompt_ids = chunks[0]["choices"][0]["prompt_token_ids"]
    assert len(prompt_ids) == 3 and prompt_ids[1] == 1001
    assert all(100 <= i <= 999 for i in (prompt_ids[0], prompt_ids[2])) and prompt_ids[0] != prompt_ids[2]
    assert ["prompt_token_ids" in chunk["choices"][0] for chunk in chunks] == [True, False, False]
    again = await _chunks(client, COMPLETIONS, {"prompt": "upon Once", "return_token_ids": True})
    assert again[0]["choices"][0]["prompt_token_ids"] == [prompt_ids[2], prompt_ids[0]]
    by_ids = await _chunks(client, COMPLETIONS, {"prompt": [*prompt_ids, 1002], "return_token_ids": True})
    assert by_ids[0]["choices"][0]["prompt_token_ids"] == [*prompt_ids, 1002]
    assert _text(by_ids) == " t3 t4 t5"


async def test_token_ids_on_chat(client: TestClient) -> None:
    """vLLM's chat shape: the prompt's ids at the top of the role chunk, each token's on its choice."""
    messages = [{"role": "system", "content": "Be t2"}, {"role": "user", "content": "Hi"}]
    chunks = await _chunks(client, CHAT, {"messages": messages, "return_token_ids": True})
    prompt_ids = chunks[0]["prompt_token_ids"]
    assert len(prompt_ids) == 3 and prompt_ids[1] == 1002
    assert [chunk["choices"][0].get("token_ids") for chunk in chunks] == [None, [1000], [1001], [1002]]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
async def test_no_token_ids_unless_asked(client: TestClient, path: str) -> None:
    chunks = await _chunks(client, path, {"prompt": "Once", "messages": [{"role": "user", "content": "Hi"}]})
    assert not any("prompt_token_ids" in chunk or "token_ids" in chunk["choices"][0] for chunk in chunks)
    assert "prompt_token_ids" not in chunks[0]["choices"][0]


@pytest.mark.parametrize(
    ("path", "body", "prompt_tokens"),
    [
        pytest.param(COMPLETIONS, {"prompt": "Once upon a time"}, 4, id="completions-text"),
        pytest.param(COMPLETIONS, {"prompt": [9, 8, 1000]}, 3, id="completions-token-ids"),
        pytest.param(
            CHAT,
            {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": " t0"}], **FLAGS},
            3,
            id="chat",
        ),
    ],
)
async def test_usage_chunk(client: TestClient, path: str, body: dict[str, Any], prompt_tokens: int) -> None:
    """``include_usage``: a last chunk with no choices, the prompt's words (or ids) and the tokens
    this request generated; numbered like the others."""
    chunks = await _chunks(client, path, {**body, "max_tokens": 5, "stream_options": {"include_usage": True}})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage
    assert not any("usage" in chunk for chunk in chunks[:-1])
    without = await _chunks(client, path, {**body, "max_tokens": 5})
    assert not any("usage" in chunk for chunk in without)
    assert len(without) == len(chunks) - 1


async def test_non_streamed_usage(client: TestClient) -> None:
    async with client.post(COMPLETIONS, json={"prompt": "Once t4", "max_tokens": 2}) as resp:
        body = await resp.json()
    assert body["choices"][0]["text"] == " t5 t6"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


@pytest.mark.parametrize(("args", "ignored"), [([], False), (["--ignore-continue-final-message"], True)])
def test_the_option_reaches_the_settings(monkeypatch: pytest.MonkeyPatch, args: list[str], ignored: bool) -> None:
    seen: list[fake_model.Settings] = []

    async def serve(settings: fake_model.Settings, **_: Any) -> None:
        seen.append(settings)

    monkeypatch.setattr(fake_serve, "serve", serve)
    result = CliRunner().invoke(fake_serve.command, args)
    assert result.exit_code == 0, result.output
    assert [s.ignore_continue_final_message for s in seen] == [ignored]
