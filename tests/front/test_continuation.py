"""The front's continuation decisions (:mod:`drain_router.decisions.continuation`) from
``tests/cases/continuation/``: which requests can be continued, how a stream is followed, what is done
at a cut, how a continuation's events reach the client; and, with generated streams cut and continued,
the OpenAI SDK's own SSE decoder as the oracle of what the client reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from drain_router.decisions import continuation as c
from drain_router.decisions.stream_ends import CutMark
from drain_router.http1 import sse
from tests import casefiles

DELTA_KEYS = ("role", "content", "reasoning_content", "reasoning", "tool_calls")
CHOICE_KEYS = ("token_ids", "finish_reason", "logprobs", "prompt_token_ids")
OBJECTS = {c.Api.CHAT: "chat.completion.chunk", c.Api.COMPLETIONS: "text_completion"}
LEG = "--leg--"


def data(spec: Any, api: c.Api) -> bytes:
    """One event's data from the tables' shorthand (see track.yaml's header)."""
    if isinstance(spec, str):
        return spec.encode()
    if "json" in spec:
        return json.dumps(spec["json"]).encode()
    event: dict[str, Any] = {"id": spec.get("id", "orig"), "object": OBJECTS[api]}
    event.update(created=spec.get("created", 100), model=spec.get("model", "m"))
    choice = {key: spec[key] for key in CHOICE_KEYS if key in spec}
    delta = {key: spec[key] for key in DELTA_KEYS if key in spec}
    if "text" in spec:
        event.update(object="text_completion", choices=[{"index": 0, "text": spec["text"], **choice}])
    elif delta or choice:
        event.update(object="chat.completion.chunk", choices=[{"index": 0, "delta": delta, **choice}])
    else:
        event["choices"] = []
    if "usage" in spec:
        event["usage"] = spec["usage"]
    event.update(spec.get("top", {}))
    return json.dumps(event).encode()


def api_of(row: dict[str, Any]) -> c.Api:
    return c.Api.CHAT if "/chat/" in row.get("target", "") or row.get("api") == "chat" else c.Api.COMPLETIONS


def assess(row: dict[str, Any]) -> c.Continuable | c.Reason:
    target = row.get("target", "/v1/completions")
    if "raw" in row:
        body = row["raw"].encode() * row.get("nest", 1)
    else:
        body = json.dumps(row["body"]).encode()
        if "padTo" in row:
            short = json.dumps({**row["body"], "user": ""}).encode()
            body = json.dumps({**row["body"], "user": "u" * (row["padTo"] - len(short))}).encode()
            assert len(body) == row["padTo"]
    default = "chat" if "/chat/" in target else "completions"
    dialect = c.Dialect(row.get("dialect", default))
    return c.assess(row.get("method", "POST").encode(), target.encode(), body, dialect)


def continuable(row: dict[str, Any]) -> c.Continuable:
    request = assess(row)
    assert isinstance(request, c.Continuable), request
    return request


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("continuation/assess.yaml")))
def test_assess(row: dict[str, Any]) -> None:
    result = assess(row)
    expect = row["expect"]
    if "reason" in expect:
        assert result == c.Reason(expect["reason"])
        return
    assert isinstance(result, c.Continuable), result
    assert result.api == c.Api(expect["api"])
    if "query" in expect:
        assert result.query == expect["query"]
    expected_ids = expect.get("promptIds")
    assert result.prompt_ids == (tuple(expected_ids) if expected_ids is not None else None)


_TRACKED = {
    "text": lambda t: t.text(),
    "id": lambda t: t.id,
    "created": lambda t: t.created,
    "model": lambda t: t.model,
    "roleSent": lambda t: t.role_sent,
    "finish": lambda t: t.finish_reason,
    "done": lambda t: t.done,
    "mark": lambda t: t.mark,
    "reasoningOnly": lambda t: t.reasoning_only,
    "generated": lambda t: list(t.generated()),
    "ids": lambda t: list(t.ids),
    "promptIds": lambda t: None if t.prompt_token_ids is None else list(t.prompt_token_ids),
    "promptTokens": lambda t: t.prompt_tokens,
    "unfollowed": lambda t: t.unfollowed,
    "engineError": lambda t: t.engine_error,
}


def fed(api: c.Api, events: list[Any]) -> tuple[c.StreamTracker, list[str]]:
    tracker = c.StreamTracker(api)
    kinds = []
    for spec in events:
        if spec == LEG:
            tracker.start_leg()
        else:
            kinds.append(tracker.feed(data(spec, api)).kind.value)
    return tracker, kinds


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("continuation/track.yaml")))
def test_track(row: dict[str, Any]) -> None:
    tracker, kinds = fed(c.Api(row.get("api", "chat")), row["events"])
    expect = row["expect"]
    if "kinds" in expect:
        assert kinds == expect["kinds"]
    for key, value in expect.items():
        if key != "kinds":
            assert _TRACKED[key](tracker) == value, key


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("continuation/cut.yaml")))
def test_at_cut(row: dict[str, Any]) -> None:
    request = continuable(row)
    tracker, _ = fed(request.api, row["events"])
    decision = c.at_cut(
        request,
        tracker,
        continuations=row.get("continuations", 0),
        max_continuations=row.get("maxContinuations", c.DEFAULT_MAX_CONTINUATIONS),
    )
    expect = row["expect"]
    assert decision.action.value == expect["action"]
    assert (decision.reason.value if decision.reason else None) == expect.get("reason")
    if decision.action is not c.CutAction.CONTINUE:
        assert decision.request is None
        return
    sent = decision.request
    assert sent is not None
    for key, attribute in (
        ("path", "path"),
        ("body", "body"),
        ("byTokenIds", "by_token_ids"),
        ("tokensBefore", "tokens_before"),
        ("exact", "exact"),
    ):
        if key in expect:
            assert getattr(sent, attribute) == expect[key], key


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("continuation/rewrite.yaml")))
def test_rewrite(row: dict[str, Any]) -> None:
    request = continuable(row)
    tracker, _ = fed(request.api, row["events"])
    outs = []
    for number, leg in enumerate(row["legs"]):
        decision = c.at_cut(request, tracker, continuations=number, max_continuations=3)
        assert decision.action is c.CutAction.CONTINUE and decision.request is not None, decision
        splice = c.Splice.start(request, tracker, decision.request)
        tracker.start_leg()
        out: list[Any] = []
        for spec in leg:
            event = tracker.feed(data(spec, decision.request.api))
            if event.kind is c.EventKind.DONE:
                out.append("[DONE]")
                continue
            splice, result = c.rewrite(splice, event.json)
            if result.action is c.RewriteAction.RELAY:
                out.append(json.loads(result.data))
            else:
                out.append(result.action.value)
                if result.action is c.RewriteAction.ABANDON:
                    break
        outs.append(out)
    assert outs == row["expect"]["out"]


@pytest.mark.parametrize("dialect", list(c.Dialect))
def test_each_dialect_includes_the_ones_before_it(dialect: c.Dialect) -> None:
    order = ["off", "completions", "chat", "token-ids"]
    assert [d.value for d in c.Dialect] == order
    assert [d.value for d in c.Dialect if dialect.includes(d)] == order[: order.index(dialect.value) + 1]


@pytest.mark.parametrize("event", [sse.TRUNCATED_EVENT, sse.DEADLINE_EVENT])
def test_the_routers_own_honest_ends_are_read_as_cuts(event: bytes) -> None:
    """The router's events (as it writes them) are the front's cut marks: one vocabulary, both ends."""
    (decoded,) = SSEDecoder().iter_bytes(iter([event]))
    tracker = c.StreamTracker(c.Api.CHAT)
    assert tracker.feed(decoded.data.encode()).kind is c.EventKind.CUT
    assert tracker.mark in (CutMark.UPSTREAM_TRUNCATED, CutMark.DRAIN_DEADLINE)
    assert tracker.feed(b"[DONE]").kind is c.EventKind.DONE


# --- generated: streams cut and continued, read by the SDK's decoder ------------------------------------

ALPHABETS = ("ab\n", "cdé", "fg😀", "hi ")
"""One per leg: a leg's first text never starts the answer so far (no abandonment by construction)."""
PROMPT_TOKENS = 7


def engine_events(api: c.Api, leg: int, parts: list[str], *, usage: tuple[int, int] | None, done: bool) -> list[bytes]:
    """What a fake engine streams for one leg: a role delta (chat), the parts, and when it ends
    properly a finish chunk, a usage chunk (when asked) and ``[DONE]``."""
    ident = {"id": f"leg{leg}", "object": OBJECTS[api], "created": 100 + leg, "model": "m"}
    events = []
    if api is c.Api.CHAT:
        events.append({**ident, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for part in parts:
        piece = {"delta": {"content": part}} if api is c.Api.CHAT else {"text": part}
        events.append({**ident, "choices": [{"index": 0, **piece}]})
    if done:
        last = {"delta": {}} if api is c.Api.CHAT else {"text": ""}
        events.append({**ident, "choices": [{"index": 0, **last, "finish_reason": "stop"}]})
        if usage is not None:
            prompt, completion = usage
            counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
            events.append({**ident, "choices": [], "usage": counts})
    return [json.dumps(e).encode() for e in events] + ([b"[DONE]"] if done else [])


def frame(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


@given(
    api=st.sampled_from(list(c.Api)),
    legs=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    texts=st.data(),
    marks=st.lists(st.sampled_from([None, *CutMark]), min_size=5, max_size=5),
    include_usage=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_a_spliced_stream_reads_as_one_answer(
    api: c.Api, legs: list[int], texts: st.DataObject, marks: list[CutMark | None], include_usage: bool
) -> None:
    """However often a stream is cut (with the router's mark or a bare end) and wherever: the client's
    bytes, read by the SDK's decoder, are one answer: exactly one ``[DONE]``, last, one ``id`` and one
    ``created``, at most one role delta, the text every leg's parts in order, and the usage the
    original prompt's with every leg's completion tokens; or, past ``--max-continuations``, the parts
    so far and an honest error last, never a ``[DONE]``."""
    parts = [
        [texts.draw(st.text(alphabet=ALPHABETS[i % 4], min_size=1, max_size=4)) for _ in range(n)]
        for i, n in enumerate(legs)
    ]
    dialect = c.Dialect.CHAT if api is c.Api.CHAT else c.Dialect.COMPLETIONS
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 1000}
    if api is c.Api.CHAT:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "P"
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    target = c.CHAT_PATH if api is c.Api.CHAT else c.COMPLETIONS_PATH
    request = c.assess(b"POST", target.encode(), json.dumps(body).encode(), dialect)
    assert isinstance(request, c.Continuable)

    # The front, as its I/O will run it: relay, and at each cut decide, continue and splice.
    tracker = c.StreamTracker(api)
    client = []
    before = 0
    splice: c.Splice | None = None
    last = len(parts) - 1
    for leg, leg_parts in enumerate(parts):
        usage = (PROMPT_TOKENS + before, len(leg_parts)) if include_usage else None
        events = engine_events(api, leg, leg_parts, usage=usage, done=leg == last)
        if leg < last and marks[leg] is not None:
            events.append(json.dumps({"error": {"message": "cut", "type": marks[leg]}}).encode())
        held = None
        for raw in events:
            event = tracker.feed(raw)
            if event.kind is c.EventKind.CUT:
                held = frame(raw)
                continue
            if splice is None or event.kind is c.EventKind.DONE:
                client.append(frame(raw))
                continue
            splice, result = c.rewrite(splice, event.json)
            assert result.action is not c.RewriteAction.ABANDON
            if result.action is c.RewriteAction.RELAY:
                client.append(frame(result.data))
        before += len(leg_parts)
        if leg == last:
            break
        decision = c.at_cut(request, tracker, continuations=leg, max_continuations=c.DEFAULT_MAX_CONTINUATIONS)
        if decision.action is c.CutAction.GIVE_UP:
            assert decision.reason is c.Reason.MAX_CONTINUATIONS
            client.append(held or sse.TRUNCATED_EVENT)
            break
        assert decision.action is c.CutAction.CONTINUE and decision.request is not None
        so_far = "".join(p for leg_parts in parts[: leg + 1] for p in leg_parts)
        sent = decision.request.body
        if api is c.Api.COMPLETIONS:
            assert sent["prompt"] == ("P" + so_far)
        elif so_far:
            assert sent["messages"][-1] == {"role": "assistant", "content": so_far}
        assert sent["max_tokens"] == 1000 - before
        splice = c.Splice.start(request, tracker, decision.request)
        tracker.start_leg()

    # The oracle: the SDK's decoder over the client's bytes, split anywhere.
    stream = b"".join(client)
    decoded = list(SSEDecoder().iter_bytes(iter([stream[:5], stream[5:]])))
    datas = [e.data for e in decoded]
    gave_up = len(parts) - 1 > c.DEFAULT_MAX_CONTINUATIONS
    chunks = [json.loads(d) for d in datas if d != "[DONE]"]
    if gave_up:
        assert "[DONE]" not in datas
        assert "error" in chunks[-1] and all("error" not in e for e in chunks[:-1])
        chunks = chunks[:-1]
        answered = parts[: c.DEFAULT_MAX_CONTINUATIONS + 1]
    else:
        assert datas.count("[DONE]") == 1 and datas[-1] == "[DONE]"
        answered = parts
    assert len({e["id"] for e in chunks}) <= 1 and len({e["created"] for e in chunks}) <= 1
    choices = [e["choices"][0] for e in chunks if e["choices"]]
    if api is c.Api.CHAT:
        assert sum(1 for ch in choices if ch["delta"].get("role")) == 1
        text = "".join(ch["delta"].get("content") or "" for ch in choices)
    else:
        text = "".join(ch["text"] for ch in choices)
    assert text == "".join(p for leg_parts in answered for p in leg_parts)
    usages = [e["usage"] for e in chunks if e.get("usage")]
    if include_usage and not gave_up:
        total = sum(legs)
        assert usages == [
            {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": total, "total_tokens": PROMPT_TOKENS + total}
        ]
    else:
        assert usages == []


@pytest.mark.parametrize("api", list(c.Api))
def test_an_answer_finished_by_its_budget_gets_its_finish_reason_when_it_was_cut(api: c.Api) -> None:
    """Cut between its last token and its finish_reason: the front ends it with a last chunk of the
    stream's shape saying "length", read by the SDK as such; none when the finish_reason came."""
    tracker = c.StreamTracker(api)
    tracker.feed(data({"text": "Hi"} if api is c.Api.COMPLETIONS else {"content": "Hi"}, api))
    last = c.finish_event(tracker)
    assert last is not None
    [event] = [e for e in SSEDecoder().iter_bytes(iter([last])) if e.data]
    chunk = json.loads(event.data)
    assert (chunk["id"], chunk["created"], chunk["model"]) == ("orig", 100, "m")
    assert chunk["object"] == OBJECTS[api]
    assert chunk["choices"][0]["finish_reason"] == "length"
    tracker.feed(data({"text": "", "finish_reason": "stop"}, api))
    assert c.finish_event(tracker) is None
