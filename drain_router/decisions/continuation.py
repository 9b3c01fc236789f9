"""Continuing a cut stream on another pod: what the front decides, from a request's body and the events
relayed so far. Purely computational, no I/O: the front reads and writes, and asks here.

The front relays an OpenAI-compatible ``POST /v1/completions`` or ``/v1/chat/completions`` with
``stream: true``. When the stream is cut (the router's cut mark, see
:mod:`drain_router.decisions.stream_ends`, or the connection lost mid-stream), it sends a continuation
to another pod and splices its events into the same client response. The steps, one concept each:

- :func:`assess`: whether a request can be continued at all (:class:`Continuable`), or why not
  (:class:`Reason`, a metric label). Once per request, before it is sent.
- :class:`StreamTracker`: follows the stream as its events are relayed, one complete event's data at a
  time, over the original and every continuation (a leg each).
- :func:`at_cut`: at a cut, continue (with the request to send: :class:`ContinuationRequest`), finish
  (the answer was complete) or give up with the honest error (:class:`CutDecision`).
- :class:`Splice` and :func:`rewrite`: each continuation event as the client gets it.

**What the client is promised**: the answer continues, well-formed (one ``id``, one ``created``, one
role delta, one ``[DONE]``, usage summed). It is the same draw only where the engine makes it so:
sampling at ``temperature > 0`` (``seed`` or not) is a fresh draw from the cut, whose random stream
restarts there, and even greedy decoding diverges where the engine's batched prefill of the partial
answer does not match its one-token decode bit for bit (measured on llama-cpp-python with SmolLM2: 0 to
5 of 20 greedy streams byte-identical after a cut in a prototype, 20 of 20 with the partial replayed
one token at a time; 0 of 8 in the real-engine test, the first difference a median of 11 characters
after the cut).

Fields the continuation passes on unchanged, and why:

- ``stop``: the engine holds back text that could start a stop string, so only emitted text is in
  the partial answer, and the continuation matches stop strings from there. A stop string that would
  have straddled the cut (its start emitted, its end not) is not matched: an emitted prefix is by
  construction not a stop string's start.
- ``seed``, ``temperature`` and the sampling penalties: passed on; a fresh draw (above). Penalties
  over output tokens only (``frequency_penalty``, ``presence_penalty``) start over, since the partial
  is now prompt.
- ``logprobs``: the continued tokens' logprobs are relayed as the engine gives them (they are the
  continuation's, computed with the partial as context: consistent per token). Completions
  ``text_offset`` is dropped from continued events: engines disagree on its origin (vLLM counts from
  the start of the request's generated text, llama-cpp-python from its prompt's start), so the front
  cannot shift it right for both, and a wrong offset is worse than none. In a chat continuation
  re-framed from ``/v1/completions`` (token ids), logprobs are converted to chat's shape.
- ``stream_options``: kept as the client asked. Usage is rewritten, never added.
"""

from __future__ import annotations

import array
import dataclasses
import enum
import json
from typing import Any, TypeGuard

from drain_router.decisions.stream_ends import CutMark, cut_mark, ends_stream

MAX_BODY_BYTES = 1 << 20
"""The largest request body the front continues (1 MiB). The front keeps the parsed body for as long as
the stream runs, to build a continuation from: about the body's size again in Python objects
(measured: a 32k-token context is 128 KB raw, 129 KB parsed), plus the text so far (about 1 byte a
character for ASCII, 2 for CJK, 4 for emoji) and, in the token-ids dialect, 8 bytes a token. So a
tracked stream costs at most about 1 MiB plus its answer; 1,000 such streams at most about 1 GiB. A
larger body is relayed, never continued, and costs nothing kept."""

DEFAULT_MAX_CONTINUATIONS = 3
"""``--max-continuations``: continuations per client response."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a ``/v1/completions`` request that sets none: OpenAI's documented default, and
vLLM's and llama-cpp-python's. A continuation states what is left of it explicitly, or it would get 16
again."""

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"

DONE_EVENT = b"data: [DONE]\n\n"
"""What ends the client's response when the answer was complete but its ``[DONE]`` was cut."""

STRUCTURED_FIELDS = ("structured_outputs", "grammar", "regex", "ebnf", "json_schema")
"""Top-level fields that constrain decoding (vLLM, llama-cpp-python, SGLang), besides ``guided_*`` and
``response_format``. A grammar starts at the first generated token, so a partial answer moved into the
prompt would not be matched against it."""

CHAT_ONLY_FIELDS = (
    "messages",
    "max_completion_tokens",
    "continue_final_message",
    "add_generation_prompt",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "response_format",
)
"""Removed from a chat request re-sent to ``/v1/completions`` by token ids (``logprobs`` is mapped)."""

REASONING_KEYS = ("reasoning_content", "reasoning")
"""Where engines stream a chat answer's thinking channel (vLLM: ``reasoning_content``, newer
``reasoning``)."""


class Dialect(enum.StrEnum):
    """``--continuation``: how the fronted engine can be asked to continue. Each includes the one before."""

    OFF = "off"
    """Never continue: the engine is unknown or cannot."""
    COMPLETIONS = "completions"
    """``/v1/completions`` with prompt + text so far: every OpenAI-compatible engine serves it."""
    CHAT = "chat"
    """Also ``/v1/chat/completions`` with ``continue_final_message`` (vLLM, SGLang). An engine that
    ignores the field (llama-cpp-python) starts a new turn instead, which the front cannot always
    tell (:func:`rewrite`): set this only for engines that honour it."""
    TOKEN_IDS = "token-ids"
    """Also by token ids where the engine streams them (vLLM ``return_token_ids``): the continuation is
    ``/v1/completions`` with prompt ids + generated ids, no re-tokenization at the cut."""

    def includes(self, other: Dialect) -> bool:
        order = list(Dialect)
        return order.index(self) >= order.index(other)


class Api(enum.StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class Reason(enum.StrEnum):
    """Why a stream is not continued (a metric label). The first group is decided once per request
    (:func:`assess`), the second at a cut (:func:`at_cut`), the last on a continuation's first events
    (:func:`rewrite`)."""

    DIALECT_OFF = "dialect_off"
    NOT_COMPLETIONS = "not_completions"
    """Not a ``POST`` to ``/v1/completions`` or ``/v1/chat/completions``."""
    CHAT_DIALECT = "chat_dialect"
    """A chat request, and the engine's dialect is ``completions`` only."""
    BODY_TOO_LARGE = "body_too_large"
    NOT_JSON = "not_json"
    """The body is not a JSON object."""
    NOT_STREAMED = "not_streamed"
    SEVERAL_CHOICES = "several_choices"
    """``n`` or ``best_of`` over 1: the choices interleave, each would need its own continuation."""
    ECHO = "echo"
    """``echo`` would echo the partial answer as prompt."""
    STRUCTURED_OUTPUT = "structured_output"
    TOOLS = "tools"
    PROMPT_NOT_TEXT = "prompt_not_text"
    """A completions prompt that is not one string (or, in the token-ids dialect, one token list); a
    chat whose client-side final message to continue has no string content."""

    REASONING_CUT = "reasoning_cut"
    MAX_CONTINUATIONS = "max_continuations"
    ENGINE_ERROR = "engine_error"
    """The engine streamed an error event: relayed, the stream is over."""
    UNFOLLOWED = "unfollowed"
    """An event the tracker could not follow (not JSON, several choices, a tool-call delta)."""
    NO_TOKEN_IDS = "no_token_ids"
    """A token-list prompt, and the stream did not carry the generated ids to continue it with."""

    NOT_EXTENDED = "not_extended"
    """The continuation's first content did not extend the answer (:func:`rewrite`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Continuable:
    """A request that can be continued: what :func:`assess` parsed, kept for the stream's life."""

    api: Api
    target: str
    """The original request target (path and query)."""
    query: str
    """The target's query string with its ``?`` (or ""), kept on every continuation."""
    body: dict[str, Any]
    """The parsed body, never mutated."""
    dialect: Dialect
    prompt_ids: tuple[int, ...] | None = None
    """A completions prompt given as one token list (token-ids dialect)."""

    def first_body(self) -> dict[str, Any] | None:
        """The body to send first, when it is not the client's as is: in the token-ids dialect the
        engine is asked to stream token ids (``return_token_ids``). The extra ``token_ids`` and
        ``prompt_token_ids`` fields then reach the client too (the original events are relayed
        untouched; the SDK keeps unknown fields as extras)."""
        if self.dialect is Dialect.TOKEN_IDS and self.body.get("return_token_ids") is not True:
            return {**self.body, "return_token_ids": True}
        return None


def _is_token_list(value: Any) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _over_one(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 1


def _structured(body: dict[str, Any]) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        return True  # json_object, json_schema, structural_tag, ...
    if any(body.get(name) is not None for name in STRUCTURED_FIELDS):
        return True
    return any(key.startswith("guided_") and value is not None for key, value in body.items())


def _tools(body: dict[str, Any]) -> bool:
    if body.get("tools") and body.get("tool_choice") != "none":
        return True
    return bool(body.get("functions")) and body.get("function_call") != "none"


def assess(method: bytes, target: bytes, body: bytes, dialect: Dialect) -> Continuable | Reason:
    """Whether a request can be continued, decided once before it is sent; the checks in this order
    (the first that fails is the reason): dialect ``off``; not a ``POST`` to ``/v1/completions`` or
    ``/v1/chat/completions`` (query string aside; other paths, prefixed or not, are relayed only);
    chat with the ``completions`` dialect; a body over :data:`MAX_BODY_BYTES` (checked before it is
    parsed); not a JSON object; ``stream`` not ``true``; ``n`` or ``best_of`` over 1; ``echo``;
    structured output (``response_format`` of a type other than ``text``, a non-null ``guided_*``
    or :data:`STRUCTURED_FIELDS` field); tools (``tools`` or ``functions`` given, unless their choice
    is ``"none"``); the prompt (:attr:`Reason.PROMPT_NOT_TEXT`)."""
    if dialect is Dialect.OFF:
        return Reason.DIALECT_OFF
    path, mark, query = target.decode("latin-1").partition("?")
    if method != b"POST" or path not in (COMPLETIONS_PATH, CHAT_PATH):
        return Reason.NOT_COMPLETIONS
    api = Api.CHAT if path == CHAT_PATH else Api.COMPLETIONS
    if api is Api.CHAT and not dialect.includes(Dialect.CHAT):
        return Reason.CHAT_DIALECT
    if len(body) > MAX_BODY_BYTES:
        return Reason.BODY_TOO_LARGE
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: a body nested deeper than the parser goes
        return Reason.NOT_JSON
    if not isinstance(parsed, dict):
        return Reason.NOT_JSON
    if parsed.get("stream") is not True:
        return Reason.NOT_STREAMED
    if _over_one(parsed.get("n")) or _over_one(parsed.get("best_of")):
        return Reason.SEVERAL_CHOICES
    if parsed.get("echo"):
        return Reason.ECHO
    if _structured(parsed):
        return Reason.STRUCTURED_OUTPUT
    if _tools(parsed):
        return Reason.TOOLS
    prompt_ids: tuple[int, ...] | None = None
    if api is Api.COMPLETIONS:
        prompt = parsed.get("prompt")
        if dialect is Dialect.TOKEN_IDS and _is_token_list(prompt):
            prompt_ids = tuple(prompt)
        elif not isinstance(prompt, str):
            return Reason.PROMPT_NOT_TEXT
    else:
        messages = parsed.get("messages")
        if not isinstance(messages, list) or not messages:
            return Reason.PROMPT_NOT_TEXT
        last = messages[-1]
        if parsed.get("continue_final_message") and not (
            isinstance(last, dict) and isinstance(last.get("content"), str)
        ):
            return Reason.PROMPT_NOT_TEXT
    return Continuable(
        api=api,
        target=target.decode("latin-1"),
        query=mark + query,
        body=parsed,
        dialect=dialect,
        prompt_ids=prompt_ids,
    )


class EventKind(enum.Enum):
    CHUNK = "chunk"
    """A chunk (or any other JSON event): relayed."""
    DONE = "done"
    """``[DONE]``: relayed; the stream is over."""
    CUT = "cut"
    """The router's cut mark: not relayed (the front continues, or relays it as the honest error)."""
    ERROR = "error"
    """The engine's error event: relayed; the stream is over, not continued."""
    UNREADABLE = "unreadable"
    """Data that is not JSON: relayed as is; the stream can no longer be followed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    json: Any = None
    """The parsed data (for :func:`rewrite`); None for ``[DONE]`` and unreadable data."""


class StreamTracker:
    """One client response's stream, followed as its events are relayed: the original's, then each
    continuation's (:meth:`start_leg` between them). Fed one complete event's data at a time (an event
    the connection cut inside is never fed: it was never relayed either).

    Cost: one ``json.loads`` per event, nothing re-serialized: :meth:`feed` took 5.0 µs for a 215-byte
    completions chunk and 5.8 µs for a 239-byte chat chunk, ``json.loads`` alone 2.8 and 3.4 µs of it
    (timeit best of 5, Python 3.11, a shared 2-core machine): about 5 % of a core at 10,000 events a
    second. Memory, bounded by the answer: its text as a list
    of parts (no quadratic ``+=``), a few counters, the first ``id``/``created``/``model``, and in the
    token-ids dialect the generated ids in an ``array`` (8 bytes a token) and the prompt's ids from the
    first chunk. Only choice 0 is followed (``n > 1`` is never tracked).

    A cut inside the thinking channel (``reasoning_content`` or ``reasoning`` deltas and no content
    yet) is recorded (:attr:`reasoning_only`) and not continued: a continuation would have to resume
    the thinking, which depends on the chat template, and templates often drop an assistant message's
    reasoning; resumed as content it would put thinking in the answer. A cut after content began is
    continued from the content alone (the thinking so far is not sent back)."""

    __slots__ = (
        "api",
        "created",
        "done",
        "engine_error",
        "finish_reason",
        "id",
        "ids",
        "ids_whole",
        "leg_events",
        "leg_ids",
        "leg_usage",
        "legs",
        "legs_exact",
        "legs_tokens",
        "mark",
        "model",
        "parts",
        "prompt_token_ids",
        "prompt_tokens",
        "reasoning",
        "role_sent",
        "unfollowed",
    )

    def __init__(self, api: Api) -> None:
        self.api = api
        self.parts: list[str] = []
        """The answer's text so far (content or completion text), as relayed."""
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.role_sent = False
        """A role delta reached the client (a continuation's own is then dropped)."""
        self.reasoning = False
        """A thinking-channel delta was seen."""
        self.finish_reason: str | None = None
        self.done = False
        self.mark: CutMark | None = None
        self.engine_error = False
        self.unfollowed = False
        self.ids = array.array("q")
        """The generated token ids, over every leg, where the engine streams them."""
        self.ids_whole = True
        """Every content event so far carried its ``token_ids``: :attr:`ids` is the whole answer."""
        self.prompt_token_ids: tuple[int, ...] | None = None
        """The first leg's prompt as ids (vLLM's first chunk, ``return_token_ids``)."""
        self.prompt_tokens: int | None = None
        """The first leg's ``usage.prompt_tokens``, when it streamed any."""
        self.legs = 0
        """Continuations started (0: the original is streaming)."""
        self.legs_tokens = 0
        """Tokens generated in the legs before this one."""
        self.legs_exact = True
        self.leg_events = 0
        """Content events in this leg."""
        self.leg_ids = 0
        self.leg_usage: int | None = None
        """This leg's latest ``usage.completion_tokens``."""

    def feed(self, data: bytes) -> Event:
        """One complete event's data, in order."""
        if ends_stream(data):
            self.done = True
            return Event(EventKind.DONE)
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            self.unfollowed = True
            return Event(EventKind.UNREADABLE)
        if not isinstance(event, dict):
            self.unfollowed = True
            return Event(EventKind.CHUNK, event)
        mark = cut_mark(event)
        if mark is not None:
            self.mark = mark
            return Event(EventKind.CUT, event)
        if event.get("error"):
            self.engine_error = True
            return Event(EventKind.ERROR, event)
        self._chunk(event)
        return Event(EventKind.CHUNK, event)

    def _chunk(self, event: dict[str, Any]) -> None:
        if self.id is None:
            self.id, self.created, self.model = event.get("id"), event.get("created"), event.get("model")
        first_leg = self.legs == 0
        if first_leg and self.prompt_token_ids is None and _is_token_list(event.get("prompt_token_ids")):
            self.prompt_token_ids = tuple(event["prompt_token_ids"])
        usage = event.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.leg_usage = usage["completion_tokens"]
            if first_leg and isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        if len(choices) > 1:
            self.unfollowed = True
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            self.unfollowed = True
            return
        if first_leg and self.prompt_token_ids is None and _is_token_list(choice.get("prompt_token_ids")):
            self.prompt_token_ids = tuple(choice["prompt_token_ids"])
        text = choice.get("text")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("role"):
                self.role_sent = True
            if delta.get("tool_calls") or delta.get("function_call"):
                self.unfollowed = True
            if any(delta.get(key) for key in REASONING_KEYS):
                self.reasoning = True
            text = delta.get("content")
        elif self.api is Api.CHAT:
            self.role_sent = True  # a chat continued by token ids: re-framed with a role delta first
        ids = choice.get("token_ids")
        if isinstance(text, str) and text:
            self.parts.append(text)
            self.leg_events += 1
            if not _is_token_list(ids):
                self.ids_whole = False
        if _is_token_list(ids):
            self.ids.extend(ids)
            self.leg_ids += len(ids)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    @property
    def reasoning_only(self) -> bool:
        """The stream is inside its thinking channel: reasoning seen, no content yet."""
        return self.reasoning and not self.parts

    def text(self) -> str:
        return "".join(self.parts)

    def _leg(self) -> tuple[int, bool]:
        """This leg's tokens and whether the count is exact: its token ids when every content event
        carried them (exact), else its latest usage (exact as of that event: engines that stream
        usage per chunk), else its content events (a lower bound: one event can carry several tokens,
        e.g. held-back UTF-8 fragments or stop-string prefixes, speculative decoding)."""
        if self.ids_whole and self.leg_ids:
            return self.leg_ids, True
        if self.leg_usage is not None:
            return self.leg_usage, True
        return self.leg_events, not self.leg_events

    def generated(self) -> tuple[int, bool]:
        """Tokens generated so far over every leg, and whether the count is exact."""
        tokens, exact = self._leg()
        return self.legs_tokens + tokens, self.legs_exact and exact

    def start_leg(self) -> None:
        """A continuation starts: this leg's count is folded into the legs before."""
        self.legs_tokens, self.legs_exact = self.generated()
        self.legs += 1
        self.leg_events = self.leg_ids = 0
        self.leg_usage = None
        self.finish_reason = None
        self.mark = None


class CutAction(enum.Enum):
    CONTINUE = "continue"
    """Send :attr:`CutDecision.request` to another pod and splice it in (:class:`Splice`)."""
    FINISH = "finish"
    """The answer was complete (a ``finish_reason`` was relayed, or the budget is used up): end the
    response with :data:`DONE_EVENT`. Nothing is made up: no ``finish_reason`` chunk for a used-up
    budget, no usage chunk for a client that asked for usage and whose usage chunk was cut."""
    GIVE_UP = "give_up"
    """End with the honest error: the router's cut mark that was held back, else the front's own."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContinuationRequest:
    path: str
    """Where to send it (with the original query string)."""
    body: dict[str, Any]
    api: Api
    """The API the continuation speaks (``completions`` for a chat continued by token ids)."""
    by_token_ids: bool
    tokens_before: int
    """Tokens generated before this continuation, over every leg."""
    exact: bool
    """:attr:`tokens_before` is exact (token ids, or usage); otherwise it is a lower bound, so the
    reduced ``max_tokens`` may let the whole answer run over the client's by the difference."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CutDecision:
    action: CutAction
    reason: Reason | None = None
    """Why not continued (:attr:`CutAction.GIVE_UP`)."""
    request: ContinuationRequest | None = None


_BUDGETS = ("max_tokens", "max_completion_tokens")


def _budget(request: Continuable, generated: int) -> dict[str, int | None] | None:
    """What is left of each token budget the request has (None: none left, the answer is done). A
    completions request without ``max_tokens`` has :data:`COMPLETIONS_DEFAULT_MAX_TOKENS`; an
    explicit ``null`` (the engine's own limit: the rest of the context) stays null."""
    left: dict[str, int | None] = {}
    for key in _BUDGETS:
        if key not in request.body and not (key == "max_tokens" and request.api is Api.COMPLETIONS):
            continue
        value = request.body.get(key, COMPLETIONS_DEFAULT_MAX_TOKENS)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if value - generated <= 0:
                return None
            left[key] = int(value) - generated
        else:
            left[key] = None
    return left


def _all_text_messages(messages: list[Any]) -> bool:
    return all(isinstance(m, dict) and isinstance(m.get("content"), str | None) for m in messages)


def at_cut(request: Continuable, tracker: StreamTracker, *, continuations: int, max_continuations: int) -> CutDecision:
    """What to do when a stream that did not end with ``[DONE]`` is cut (``continuations``: how many
    this response had already).
    Checked in order: a ``finish_reason`` relayed (FINISH); the engine's error, an event not followed,
    a cut in the thinking channel (GIVE_UP); the budget used up (FINISH); past
    ``max_continuations`` (GIVE_UP); then the continuation.

    The continuation, by dialect and what the stream carried:

    - by token ids (dialect ``token-ids``, every content event carried ``token_ids``, the prompt's ids
      known from the request or the first chunk, and for chat every message's content a string:
      multimodal prompt ids hold placeholders that ``/v1/completions`` cannot fill):
      ``/v1/completions`` with ``prompt`` = prompt ids + generated ids. A chat goes there too, with
      chat's fields removed and ``logprobs``/``top_logprobs`` mapped to completions' ``logprobs``;
    - completions: ``prompt`` + text so far;
    - chat: ``messages`` + an assistant message with the text so far, ``continue_final_message: true``,
      ``add_generation_prompt: false`` (a client's own final message being continued gets the text
      appended instead).

    Nothing relayed yet: the original request again (a retry). ``max_tokens`` and
    ``max_completion_tokens`` are reduced by the tokens generated (:meth:`StreamTracker.generated`)."""
    if tracker.finish_reason:
        return CutDecision(action=CutAction.FINISH)
    if tracker.engine_error:
        return CutDecision(action=CutAction.GIVE_UP, reason=Reason.ENGINE_ERROR)
    if tracker.unfollowed:
        return CutDecision(action=CutAction.GIVE_UP, reason=Reason.UNFOLLOWED)
    if tracker.reasoning_only:
        return CutDecision(action=CutAction.GIVE_UP, reason=Reason.REASONING_CUT)
    generated, exact = tracker.generated()
    left = _budget(request, generated)
    if left is None:
        return CutDecision(action=CutAction.FINISH)
    if continuations >= max_continuations:
        return CutDecision(action=CutAction.GIVE_UP, reason=Reason.MAX_CONTINUATIONS)
    prompt_ids = request.prompt_ids or tracker.prompt_token_ids
    text = tracker.text()
    by_ids = (
        request.dialect is Dialect.TOKEN_IDS
        and prompt_ids is not None
        and tracker.ids_whole
        and len(tracker.ids) > 0
        and (request.api is Api.COMPLETIONS or _all_text_messages(request.body["messages"]))
    )
    if request.prompt_ids is not None and text and not by_ids:
        return CutDecision(action=CutAction.GIVE_UP, reason=Reason.NO_TOKEN_IDS)
    body = {**(request.first_body() or request.body), **left}
    path, api = request.target, request.api
    if by_ids:
        assert prompt_ids is not None
        if request.api is Api.CHAT:
            body = _chat_as_completions(body, left)
            path, api = COMPLETIONS_PATH + request.query, Api.COMPLETIONS
        body["prompt"] = [*prompt_ids, *tracker.ids]
    elif not text:
        pass  # nothing relayed: the original again
    elif request.api is Api.COMPLETIONS:
        body["prompt"] = request.body["prompt"] + text
    else:
        messages = list(request.body["messages"])
        if request.body.get("continue_final_message"):
            last = messages[-1]
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    continuation = ContinuationRequest(
        path=path, body=body, api=api, by_token_ids=by_ids, tokens_before=generated, exact=exact
    )
    return CutDecision(action=CutAction.CONTINUE, request=continuation)


def finish_event(tracker: StreamTracker) -> bytes | None:
    """The event that ends an answer finished by its token budget whose ``finish_reason`` was cut
    (:attr:`CutAction.FINISH` with none relayed): a last chunk with ``finish_reason: "length"`` in
    the stream's own shape, its ``id``, ``created`` and ``model``; None when the stream relayed its
    ``finish_reason`` already."""
    if tracker.finish_reason:
        return None
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if tracker.api is Api.CHAT:
        choice["delta"] = {}
        kind = "chat.completion.chunk"
    else:
        choice["text"] = ""
        kind = "text_completion"
    event = {"id": tracker.id, "object": kind, "created": tracker.created, "model": tracker.model}
    return b"data: " + json.dumps({**event, "choices": [choice]}).encode() + b"\n\n"


def _chat_as_completions(body: dict[str, Any], left: dict[str, int | None]) -> dict[str, Any]:
    """A chat body as a ``/v1/completions`` body (its prompt set by the caller): ``max_tokens`` the
    least of what is left of both budgets, explicitly ``null`` when neither is set (completions'
    default of 16 would cut the answer short); ``logprobs: true`` with ``top_logprobs: k`` becomes
    ``logprobs: k``."""
    out = {key: value for key, value in body.items() if key not in CHAT_ONLY_FIELDS}
    limits = [v for v in left.values() if v is not None]
    out["max_tokens"] = min(limits) if limits else None
    if body.get("logprobs"):
        out["logprobs"] = body.get("top_logprobs") or 0
    out["return_token_ids"] = True
    return out


class RewriteAction(enum.Enum):
    RELAY = "relay"
    DROP = "drop"
    """Not for the client (the continuation's own role-only delta)."""
    ABANDON = "abandon"
    """The continuation does not extend the answer: close it and end with the honest error."""
    HOLD = "hold"
    """Not yet for the client: its content so far could be the answer's start echoed back. Held
    until the next content decides (RELAY: the held events go first; ABANDON: they are dropped)."""


ECHO_CHARS = 24
"""How much of a continuation's first content (whitespace aside) that repeats the answer's start
makes it an echo (or a new answer): up to this, its events are held and judged on what follows."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rewrite:
    action: RewriteAction
    data: bytes = b""
    """The event's data as the client gets it (RELAY)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Splice:
    """What rewriting one continuation's events needs, fixed when it starts (:meth:`start`), and
    whether its first content was checked yet."""

    id: str | None
    created: int | None
    model: str | None
    client_api: Api
    reframe: bool
    """A chat continued by token ids: ``text_completion`` chunks become ``chat.completion.chunk``."""
    role_sent: bool
    partial: str
    """The answer's text before this continuation."""
    tokens_before: int
    prompt_tokens: int | None
    """The original request's prompt tokens, when known (its usage, or its prompt ids)."""
    checked: bool = False
    """The first content was seen and extends the answer (from the start for a retry: nothing to
    extend)."""
    lead: str = ""
    """The continuation's content so far while it is whitespace alone (relayed): checked together
    with the first content that is not."""

    @classmethod
    def start(cls, request: Continuable, tracker: StreamTracker, continuation: ContinuationRequest) -> Splice:
        """Call before :meth:`StreamTracker.start_leg`."""
        prompt_ids = request.prompt_ids or tracker.prompt_token_ids
        prompt_tokens = tracker.prompt_tokens
        if prompt_tokens is None and prompt_ids is not None:
            prompt_tokens = len(prompt_ids)
        return cls(
            id=tracker.id,
            created=tracker.created,
            model=tracker.model,
            client_api=request.api,
            reframe=request.api is Api.CHAT and continuation.api is Api.COMPLETIONS,
            role_sent=tracker.role_sent,
            partial=tracker.text(),
            tokens_before=continuation.tokens_before,
            prompt_tokens=prompt_tokens,
            checked=not tracker.parts,
        )


def _usage(usage: dict[str, Any], splice: Splice) -> dict[str, Any]:
    """The continuation's usage as the original's: its prompt is the original's prompt plus the
    partial answer, its completion this leg's alone. ``prompt_tokens``: the original's when known,
    else the continuation's less the tokens before (exact only when :attr:`ContinuationRequest.exact`
    and the partial re-tokenized as generated: always by token ids); ``completion_tokens``: the tokens
    before plus this leg's; ``prompt_tokens_details`` (cached tokens of the continuation's prompt)
    dropped: it describes a prompt the client never sent."""
    out = {key: value for key, value in usage.items() if key != "prompt_tokens_details"}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return out
    original = splice.prompt_tokens if splice.prompt_tokens is not None else max(0, prompt - splice.tokens_before)
    out["prompt_tokens"] = original
    out["completion_tokens"] = splice.tokens_before + completion
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def _chat_logprobs(logprobs: Any) -> Any:
    """Completions logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``) in chat's shape."""
    if not isinstance(logprobs, dict):
        return None
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    content = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        content.append(
            {
                "token": token,
                "logprob": values[i] if i < len(values) else None,
                "bytes": list(str(token).encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(str(t).encode())} for t, lp in top.items()],
            }
        )
    return {"content": content}


def _content(choice: dict[str, Any]) -> tuple[str, str | None]:
    """A choice's text and role (chat's delta, or completions' text)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return (content if isinstance(content, str) else ""), delta.get("role")
    text = choice.get("text")
    return (text if isinstance(text, str) else ""), None


def rewrite(splice: Splice, event: Any) -> tuple[Splice, Rewrite]:
    """One continuation event (its parsed data) as the client gets it: the original's ``id``,
    ``created`` and ``model``; the continuation's role-only delta dropped when the client already had
    one; completions ``text_offset`` dropped; ``prompt_token_ids`` dropped (they would be the prompt
    plus the partial); usage rewritten (:func:`_usage`); for a chat continued by token ids the
    ``text_completion`` chunk re-framed as a ``chat.completion.chunk`` (a role delta first if the
    client had none). ``[DONE]`` is not passed here: it is relayed as the one that ends the response
    (the cut leg never sent one).

    The check, on the continuation's first choice that carries content or a role with content
    (ABANDON when it fails):

    - detected: a role delta with non-empty content (a new assistant turn sent whole, as an engine
      that ignored ``continue_final_message`` may); a first content that is a prefix of the answer so
      far, or the answer so far a prefix of it (the engine echoed the partial back); thinking-channel
      deltas before the first content (a new turn that thinks first: an answer continued from its
      content never thinks again);
    - not detected: an engine that ignores ``continue_final_message`` and starts a new turn with a
      role-only delta and fresh words (llama-cpp-python does exactly this): the stream stays
      well-formed, the text is a second answer. Guard: the ``chat`` dialect only for engines that
      honour the field. Turn markers in the text are not looked for (template-specific, and a model
      may write them).
    - whitespace alone says nothing: a first content of only spaces or newlines is relayed and
      checked together with the content after it. Nearly every completion starts with a space, and
      tokenizers emit one alone (SmolLM2's before each number: " ", "6", "4"), so a lone " " would
      otherwise look like the answer's start echoed back. An echo found after it ends the response
      with that whitespace relayed before the honest error.
    - a continuation that starts with the characters the answer started with ("The" after "The cat
      sat. ") is held (HOLD), not judged: a first word is often the same by chance (a cut at about
      1 % of token positions in everyday answers). What follows decides: its content parting from the
      answer's start releases the held events (RELAY), :data:`ECHO_CHARS` of the answer's start
      repeated (or all of it) abandons it, an end (``finish_reason``) releases them. A false alarm is
      left only for a continuation whose first 24 characters are the answer's first 24: an honest
      error, never a wrong stream."""
    if not isinstance(event, dict):
        return splice, Rewrite(action=RewriteAction.RELAY, data=json.dumps(event).encode())
    hold = False
    out = dict(event)
    for key, value in (("id", splice.id), ("created", splice.created), ("model", splice.model)):
        if value is not None:
            out[key] = value
    out.pop("prompt_token_ids", None)
    if splice.reframe:
        out["object"] = "chat.completion.chunk"
    if isinstance(out.get("usage"), dict):
        out["usage"] = _usage(out["usage"], splice)
    choices = out.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = dict(choices[0])
        text, role = _content(choice)
        given = choice.get("delta")
        if not splice.checked and isinstance(given, dict) and any(given.get(key) for key in REASONING_KEYS):
            return splice, Rewrite(action=RewriteAction.ABANDON)
        if not splice.checked and (text or role):
            if role and text:
                return splice, Rewrite(action=RewriteAction.ABANDON)
            seen = splice.lead + text
            if seen and not seen.strip():
                splice = dataclasses.replace(splice, lead=seen)
            elif seen and seen.startswith(splice.partial):
                return splice, Rewrite(action=RewriteAction.ABANDON)
            elif seen and splice.partial.startswith(seen):
                if len(seen.strip()) >= ECHO_CHARS:
                    return splice, Rewrite(action=RewriteAction.ABANDON)
                if choice.get("finish_reason"):
                    splice = dataclasses.replace(splice, checked=True)  # it ended: too short to judge
                else:
                    splice = dataclasses.replace(splice, lead=seen)
                    hold = True
            elif seen:
                splice = dataclasses.replace(splice, checked=True)
        choice.pop("prompt_token_ids", None)
        if splice.reframe:
            delta: dict[str, Any] = {"content": text} if text or not choice.get("finish_reason") else {}
            if not splice.role_sent:
                delta = {"role": "assistant", **delta}
                splice = dataclasses.replace(splice, role_sent=True)
            logprobs = choice.pop("logprobs", None)
            choice.pop("text", None)
            choice["delta"] = delta
            choice["logprobs"] = _chat_logprobs(logprobs) if logprobs else None
        else:
            if role and splice.role_sent:
                # The client has its role delta: the continuation's goes (and with it an event that
                # carried nothing else).
                delta = {k: v for k, v in choice["delta"].items() if k != "role"}
                if not text and not choice.get("finish_reason") and not any(delta.values()):
                    return splice, Rewrite(action=RewriteAction.DROP)
                choice["delta"] = delta
            elif role:
                splice = dataclasses.replace(splice, role_sent=True)
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and "text_offset" in logprobs:
                choice["logprobs"] = {k: v for k, v in logprobs.items() if k != "text_offset"}
        out["choices"] = [choice, *choices[1:]]
    action = RewriteAction.HOLD if hold else RewriteAction.RELAY
    return splice, Rewrite(action=action, data=json.dumps(out).encode())
