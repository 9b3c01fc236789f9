"""``drain-router front``, black-box: a cut stream continued on another pod, with real processes (two
pods, each a fake model server speaking vLLM's continuation dialect behind a real router, and a real
front). The fake model's answer is a sequence (token k is " t<k>") that an engine resumes from the
text so far, so the client's answer can be compared with the uninterrupted one, byte for byte.

1. Every cut is continued on the other pod: the model server ending its stream early (the router's
   ``upstream_truncated`` event), the router's drain deadline (its ``drain_deadline`` event), the
   model server killed (the router cuts its client connection) and the router killed (the
   connection cut mid-stream). The client gets one response, one ``id``, one ``[DONE]``, the whole
   answer, ``finish_reason`` at its end, no error event; the continuation and its gap are counted.
2. Each dialect: completions by text, chat with ``continue_final_message``, and by token ids
   (completions, and chat re-framed from ``/v1/completions``); usage summed.
3. Not continued, the honest end instead (as through the router alone: the error event, or the
   connection cut where the router cuts it): a request with ``n: 2``, the dialect ``off``, past
   ``--max-continuations``; and a continuation that starts a new answer (an engine that ignores
   ``continue_final_message``) is abandoned with the error event.
4. A cut with no other pod ready waits for one that becomes ready.
5. The gap at a cut runs from the first cut when the continuation is cut too before its first event.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from drain_router_dev.process import wait_until
from tests.front.rig import Pod, Rig, Streamed, metric, post, sequence, short_engine, wait_metric
from tests.process import RouterProcess

TOKENS = 24
CUT_AFTER = b" t5"
"""The cut comes once the client has this token."""


async def _busy(pods: list[Pod], timeout: float = 10.0) -> Pod:
    """The pod whose model server is generating, once one is (a request sent may not have reached it
    yet)."""

    async def generating() -> Pod | None:
        async with aiohttp.ClientSession() as session:
            for pod in pods:
                async with session.get(pod.model.url + "/stats") as resp:
                    if (await resp.json())["active"]:
                        return pod
        return None

    busy: Pod = await wait_until(generating, timeout, "a model server generating")
    return busy


async def stream_and_cut(
    front: RouterProcess,
    pods: list[Pod],
    path: str,
    body: dict[str, Any],
    cut: Callable[[Pod], Awaitable[None]] | None,
) -> Streamed:
    """Stream ``body`` through the front; once the client has read :data:`CUT_AFTER`, ``cut`` the pod
    that serves it (None: the stream is cut by itself); read to the end. A body the front cut short
    is :attr:`Streamed.cut`."""
    raw = b""
    cut_done = cut is None
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"http://127.0.0.1:{front.port}{path}", json=body) as resp,
    ):
        got = Streamed(resp.status, dict(resp.headers), b"")
        try:
            async for data in resp.content.iter_any():
                raw += data
                if not cut_done and CUT_AFTER in raw:
                    cut_done = True
                    assert cut is not None
                    await cut(await _busy(pods))
        except aiohttp.ClientPayloadError:
            got.cut = True
        assert cut_done, raw
        got.raw = raw
        return got


async def kill_model(pod: Pod) -> None:
    pod.model.proc.kill()


async def kill_router(pod: Pod) -> None:
    await pod.router.kill()


async def sigterm_router(pod: Pod) -> None:
    pod.router.signal(signal.SIGTERM)


def completions(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Count:", "stream": True, "max_tokens": TOKENS, "interval_ms": 40} | extra


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Count:"}]
    return {"model": "m", "messages": messages, "stream": True, "max_tokens": TOKENS, "interval_ms": 40, **extra}


def assert_one_whole_answer(got: Streamed, *, chat_api: bool = False) -> None:
    assert got.status == 200
    assert got.events[-1] == "[DONE]" and got.events.count("[DONE]") == 1
    assert all("error" not in chunk for chunk in got.chunks), got.raw
    assert len({chunk["id"] for chunk in got.chunks}) == 1
    assert len({chunk["created"] for chunk in got.chunks}) == 1
    assert got.text() == sequence(0, TOKENS)
    finishes = [c["choices"][0].get("finish_reason") for c in got.chunks if c.get("choices")]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    if chat_api:
        roles = [c["choices"][0]["delta"].get("role") for c in got.chunks if c.get("choices")]
        assert [r for r in roles if r] == ["assistant"]
        assert {c["object"] for c in got.chunks} == {"chat.completion.chunk"}


@pytest.mark.parametrize(
    ("cut", "router_args", "interval_ms"),
    [
        (kill_model, (), 40),
        # The deadline is 1 s after SIGTERM (grace 3 s less the 2 s margin); what is left of the
        # stream then (18 tokens at 100 ms) outlasts it.
        (sigterm_router, ("--termination-grace-secs", "3"), 100),
        (kill_router, (), 40),
    ],
    ids=["model_killed", "drain_deadline", "router_killed"],
)
async def test_a_cut_stream_is_continued_on_another_pod(
    cut: Any, router_args: tuple[str, ...], interval_ms: int
) -> None:
    async with Rig() as rig:
        pods = [await rig.pod(*router_args), await rig.pod(*router_args)]
        front = await rig.front(*pods)
        body = completions(interval_ms=interval_ms)
        got = await stream_and_cut(front, pods, "/v1/completions", body, cut)
        assert_one_whole_answer(got)
        assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 1
        assert await metric(front, "drain_router_front_continuation_gap_seconds_count") == 1
        event = await front.wait_event("front.continuing")
        assert event["leg"] == 1 and event["tokens_before"] >= 6


@pytest.mark.parametrize(
    ("path", "dialect", "body"),
    [
        ("/v1/chat/completions", "chat", chat()),
        ("/v1/completions", "token-ids", completions()),
        ("/v1/chat/completions", "token-ids", chat()),
        ("/v1/completions", "completions", completions(stream_options={"include_usage": True})),
        ("/v1/chat/completions", "chat", chat(stream_options={"include_usage": True})),
    ],
    ids=["chat", "completions-token-ids", "chat-token-ids", "completions-usage", "chat-usage"],
)
async def test_each_dialect_continues_the_answer(path: str, dialect: str, body: dict[str, Any]) -> None:
    async with Rig() as rig:
        pods = [await rig.pod(), await rig.pod()]
        front = await rig.front(*pods, continuation=dialect)
        got = await stream_and_cut(front, pods, path, body, kill_model)
        assert_one_whole_answer(got, chat_api=path.endswith("chat/completions"))
        if "stream_options" in body:
            usage = got.chunks[-1]["usage"]
            assert usage["completion_tokens"] == TOKENS
            assert usage["total_tokens"] == usage["prompt_tokens"] + TOKENS
            # The original prompt's tokens (the fake counts words): not the continuation's prompt.
            assert usage["prompt_tokens"] == 1
        if dialect == "token-ids":
            ids = [i for c in got.chunks for i in c["choices"][0].get("token_ids") or ()]
            assert ids[:6] == [1000 + k for k in range(6)]  # the original leg's, as the engine sent them


def _honest_error(got: Streamed) -> None:
    assert got.status == 200 and not got.cut
    last = json.loads(got.events[-1])
    assert last["error"]["type"] == "upstream_truncated"
    assert "[DONE]" not in got.events


@pytest.mark.parametrize(
    ("body", "flags", "error_event"),
    [
        # Not followed: relayed as the router relays, so the client sees the cut the pod's router
        # made (its connection cut: the model server died mid-stream).
        (completions(n=2), {}, False),
        (completions(), {"continuation": "off"}, False),
        # Followed, and past the limit: the front ends the response with the error event.
        (completions(), {"max_continuations": 0}, True),
    ],
    ids=["n=2", "dialect-off", "max-continuations-0"],
)
async def test_what_is_not_continued_ends_honestly(
    body: dict[str, Any], flags: dict[str, Any], error_event: bool
) -> None:
    async with Rig() as rig:
        pods = [await rig.pod(), await rig.pod()]
        front = await rig.front(*pods, **flags)
        got = await stream_and_cut(front, pods, "/v1/completions", body, kill_model)
        if error_event:
            _honest_error(got)
            assert await metric(front, "drain_router_front_continuations_total", outcome="given_up") == 1
        else:
            assert got.cut and "[DONE]" not in got.events
        assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 0


async def test_a_continuation_that_starts_a_new_answer_is_abandoned() -> None:
    """The other pod's engine ignores ``continue_final_message`` (llama.cpp's way): its continuation
    starts the answer again, and the client gets the honest error, never a second answer spliced in."""
    async with Rig() as rig:
        cut_pod = await rig.pod()
        other = await rig.pod(model_args=("--ignore-continue-final-message",))
        front = await rig.front(cut_pod, other, continuation="chat")
        # (The first pod is the one picked when both are idle: the order of --pods.)
        got = await stream_and_cut(front, [cut_pod, other], "/v1/chat/completions", chat(), kill_model)
        _honest_error(got)
        assert sequence(0, 6) in got.text() and got.text().count(" t0") == 1
        await wait_metric(front, "drain_router_front_continuations_total", 1, outcome="abandoned")


async def test_a_stream_continues_on_a_pod_that_becomes_ready_after_the_cut() -> None:
    """No other pod is ready at the cut: the continuation waits (at most --queue-timeout-secs) and
    goes to the first pod that is."""
    async with Rig() as rig:
        first = await rig.pod()
        model = await rig.model()
        later = f"http://127.0.0.1:{await _free_port()}"
        front = await rig.front(first, later, ready=1, queue_timeout_secs=30)
        task = asyncio.ensure_future(stream_and_cut(front, [first], "/v1/completions", completions(), kill_model))
        await front.wait_event("front.continuing")
        port = int(later.rsplit(":", 1)[1])
        await rig.router(model.url, "--port", str(port))
        got = await task
        assert_one_whole_answer(got)
        assert await metric(front, "drain_router_front_continuation_gap_seconds_count") == 1


async def test_a_stream_the_model_server_ended_early_is_continued() -> None:
    """The model server ends its stream without ``[DONE]`` (a clean end, not a cut connection): the
    pod's router ends it with its ``upstream_truncated`` event, which the front never relays: it
    continues on the other pod."""
    async with Rig() as rig, short_engine(6) as engine:
        short = Pod(engine, await rig.router(engine.url))  # type: ignore[arg-type]
        other = await rig.pod()
        front = await rig.front(short, other)
        got = await stream_and_cut(front, [], "/v1/completions", completions(), None)
        assert_one_whole_answer(got)
        assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 1
        assert engine.served == 1


async def test_a_stream_no_longer_followed_still_ends_as_the_engine_ended_it() -> None:
    """A tool call's delta makes a chat stream not continuable: its events are relayed as they come,
    and its ``[DONE]`` ends the response, with no error event added."""
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    events = [
        {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
        for choice in (
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
            {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
        )
    ]
    async with Rig() as rig, short_engine(0, events, done=True) as engine:
        pod = Pod(engine, await rig.router(engine.url))  # type: ignore[arg-type]
        front = await rig.front(pod, continuation="chat")
        got = await post(front.port, "/v1/chat/completions", chat())  # type: ignore[arg-type]
        assert got.status == 200 and not got.cut
        assert got.events == [*[json.dumps(e) for e in events], "[DONE]"]


async def test_a_continuation_starting_with_the_answers_first_word_is_held_then_relayed() -> None:
    """The continuation's first token is the answer's first (" t" of " t0", by chance): its events are
    held until the next content parts from the answer's start, then relayed, nothing lost."""

    def text(value: str) -> dict[str, Any]:
        return {
            "id": "c",
            "object": "text_completion",
            "created": 2,
            "model": "m",
            "choices": [{"index": 0, "text": value, "logprobs": None, "finish_reason": None}],
        }

    rest = [text(" t"), text("6"), *(text(f" t{k}") for k in range(7, TOKENS))]
    rest[-1]["choices"][0]["finish_reason"] = "length"
    async with Rig() as rig, short_engine(6) as cut_engine, short_engine(0, rest, done=True) as other_engine:
        cut_pod = Pod(cut_engine, await rig.router(cut_engine.url))  # type: ignore[arg-type]
        other = Pod(other_engine, await rig.router(other_engine.url))  # type: ignore[arg-type]
        front = await rig.front(cut_pod, other)
        got = await stream_and_cut(front, [], "/v1/completions", completions(), None)
        assert_one_whole_answer(got)
        assert (cut_engine.served, other_engine.served) == (1, 1)


async def test_an_answer_cut_after_its_last_token_is_finished_not_continued() -> None:
    """The engine sent all its budget's tokens and was cut before its finish_reason: the answer is
    whole, so the front ends it (a last chunk with finish_reason "length", then [DONE]) instead of
    asking another pod for nothing."""
    async with Rig() as rig, short_engine(6) as engine:
        pod = Pod(engine, await rig.router(engine.url))  # type: ignore[arg-type]
        other = await rig.pod()
        front = await rig.front(pod, other)
        got = await stream_and_cut(front, [], "/v1/completions", completions(max_tokens=6), None)
        assert got.status == 200 and got.events[-1] == "[DONE]" and got.events.count("[DONE]") == 1
        assert got.text() == sequence(0, 6)
        assert got.chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert {c["id"] for c in got.chunks} == {"cmpl-short"}
        assert await metric(front, "drain_router_front_continuations_total", outcome="finished") == 1
        assert (await model_started(other)) == 0


async def model_started(pod: Pod) -> int:
    async with aiohttp.ClientSession() as session, session.get(pod.model.url + "/stats") as resp:
        return int((await resp.json())["started"])


async def _free_port() -> int:
    from drain_router_dev.process import free_port

    return free_port()


async def test_the_gap_runs_from_the_first_cut_when_a_continuation_is_cut_before_its_first_event() -> None:
    """The continuation is cut too, half a second into its pod's prefill (its router killed before
    the first token), and goes on to a third pod (a prefill of 1.5 s): the gap observed is the
    client's whole wait from the first cut, at least 0.5 + 1.5 s, not the wait from the second."""
    async with Rig() as rig:
        first = await rig.pod()
        slow = [await rig.pod(model_args=("--first-token-ms", "1500")) for _ in range(2)]
        front = await rig.front(first, *slow)

        async def cut_twice(pod: Pod) -> None:
            await pod.router.kill()
            await front.wait_event("front.continuing")
            second = await _busy(slow)
            await asyncio.sleep(0.5)  # the scenario's time in the prefill, not a wait for an event
            await second.router.kill()

        got = await stream_and_cut(front, [first], "/v1/completions", completions(), cut_twice)
        assert_one_whole_answer(got)
        assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 2
        assert await metric(front, "drain_router_front_continuation_gap_seconds_count") == 1
        assert await metric(front, "drain_router_front_continuation_gap_seconds_sum") >= 2.0
