"""The loss classifier (a table in tests/cases/streams/) and the SSE decoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from drain_router_dev import streams

CASES = yaml.safe_load((Path(__file__).parent.parent / "cases" / "streams" / "classify.yaml").read_text())


def _payload(event: Any, total: int | None) -> str:
    if isinstance(event, dict) and "chunk" in event:
        chunk: dict[str, Any] = {"seq": event["chunk"], "choices": [{"text": f" tok{event['chunk']}"}]}
        if total is not None:
            chunk["total"] = total
        return json.dumps(chunk)
    assert isinstance(event, str)
    return event


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_classify(case: dict[str, Any]) -> None:
    result = streams.StreamResult(
        status=case["status"],
        events=tuple(_payload(e, case.get("total")) for e in case.get("events", [])),
        error=case.get("error"),
        expected_chunks=case.get("expected_chunks"),
        left=case.get("left", False),
    )
    outcome = streams.classify(result)
    assert outcome is streams.Outcome(case["expect"])
    assert outcome.lost == (case["expect"] not in ("ok", "left"))


def test_every_outcome_has_a_case() -> None:
    assert {c["expect"] for c in CASES} == {o.value for o in streams.Outcome}


def test_sse_decoder_whole_events() -> None:
    decoder = streams.SSEDecoder()
    assert decoder.feed(b'data: {"seq": 0}\n\ndata: [DONE]\n\n') == ['{"seq": 0}', "[DONE]"]


def test_sse_decoder_events_split_anywhere() -> None:
    wire = b'data: {"seq": 0}\r\n\r\n: comment\n\nevent: x\ndata: a\ndata:b\n\ndata: [DONE]\n\n'
    for split in range(len(wire) + 1):
        decoder = streams.SSEDecoder()
        got = decoder.feed(wire[:split]) + decoder.feed(wire[split:])
        assert got == ['{"seq": 0}', "a\nb", "[DONE]"], split


def test_sse_decoder_holds_an_unterminated_event() -> None:
    decoder = streams.SSEDecoder()
    assert decoder.feed(b"data: [DONE]\n") == []
    assert decoder.feed(b"\n") == ["[DONE]"]


def test_sse_decoder_bare_cr_line_endings() -> None:
    decoder = streams.SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\rdata: b\r\r") == ["a", "b"]
