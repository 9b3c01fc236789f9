"""The OpenAI-Realtime-shaped events of the fake model's ``/v1/realtime`` WebSocket endpoint. Pure.

A small subset of the OpenAI Realtime API's server events, enough to stand for a realtime session:
``session.created`` once the session opens; then for each client ``response.create``:
``response.created``, ``response.text.delta`` x N (numbered by ``seq`` from 0, with ``total``, as
the completions' chunks are) and ``response.done``; ``error`` for a client event it does not know.
Every event has ``type`` and a unique ``event_id``; ``session.created`` also says which server
process (``server``: its pid) holds the session, so a client can tell that it reconnected elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from drain_router_dev.fake_model import openai

#: Per-response overrides are bounded as the completions' are.
MAX_DELTAS = openai.MAX_CHUNKS
MAX_INTERVAL_MS = openai.MAX_INTERVAL_MS


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    """What one ``response.create`` asks for."""

    deltas: int
    interval_ms: int


class BadEvent(ValueError):
    """A client event the server answers with an ``error`` event (the session stays open)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_client_event(text: str) -> dict[str, Any]:
    """A client event: a JSON object with a string ``type``; :class:`BadEvent` otherwise."""
    try:
        event = json.loads(text)
    except ValueError:
        raise BadEvent("invalid_json", "the event is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise BadEvent("invalid_event", "an event is a JSON object with a string 'type'")
    return event


def _bounded(name: str, raw: object, default: int, maximum: int) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= maximum:
        raise BadEvent("invalid_value", f"{name} must be a whole number between 0 and {maximum}")
    return raw


def resolve_response(settings: openai.Settings, event: Mapping[str, Any]) -> Response:
    """A ``response.create``'s deltas and pace: ``response.deltas`` / ``response.interval_ms`` (our
    extension fields) > ``response.max_output_tokens`` (the API's) > the server's defaults."""
    body = event.get("response") or {}
    if not isinstance(body, dict):
        raise BadEvent("invalid_event", "response must be an object")
    deltas = body.get("deltas", body.get("max_output_tokens"))
    return Response(
        deltas=_bounded("deltas", deltas, settings.chunks, MAX_DELTAS),
        interval_ms=_bounded("interval_ms", body.get("interval_ms"), settings.interval_ms, MAX_INTERVAL_MS),
    )


def session_created(*, event_id: str, session_id: str, model: str, server: int) -> dict[str, Any]:
    return {
        "type": "session.created",
        "event_id": event_id,
        "session": {"id": session_id, "object": "realtime.session", "model": model, "modalities": ["text"]},
        "server": server,
    }


def response_created(*, event_id: str, response_id: str) -> dict[str, Any]:
    return {
        "type": "response.created",
        "event_id": event_id,
        "response": {"id": response_id, "object": "realtime.response", "status": "in_progress", "output": []},
    }


def text_delta(*, event_id: str, response_id: str, seq: int, total: int) -> dict[str, Any]:
    return {
        "type": "response.text.delta",
        "event_id": event_id,
        "response_id": response_id,
        "item_id": f"item_{response_id}",
        "output_index": 0,
        "content_index": 0,
        "delta": f" tok{seq}",
        "seq": seq,
        "total": total,
    }


def response_done(*, event_id: str, response_id: str, deltas: int) -> dict[str, Any]:
    return {
        "type": "response.done",
        "event_id": event_id,
        "response": {
            "id": response_id,
            "object": "realtime.response",
            "status": "completed",
            "usage": {"input_tokens": 0, "output_tokens": deltas, "total_tokens": deltas},
        },
    }


def error(*, event_id: str, code: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "event_id": event_id,
        "error": {"type": "invalid_request_error", "code": code, "message": message},
    }
