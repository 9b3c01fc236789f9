"""What a span says (drain_router.decisions.spans) and where the trace context goes upstream
(drain_router.http1.heads, drain_router.h2.rules), by table; and the drop counting of the
export queue with the SDK's real batch processor (an exporter that holds its first batch)."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drain_router.decisions import spans
from drain_router.h2 import rules
from drain_router.http1 import heads
from tests import casefiles

ATTRIBUTES = casefiles.load("tracing/attributes.yaml")
CONTEXT = casefiles.load("tracing/trace_context.yaml")


def _headers(rows: list[list[str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in rows]


@pytest.mark.parametrize("case", casefiles.params(CONTEXT))
def test_the_forwarded_head_carries_one_trace_context(case: dict[str, Any]) -> None:
    sent = _headers(case["sent"])
    request = heads.request_head(b"GET", b"/", sent, b"10.0.0.1", b"10.0.0.1", b"up", case["traced"])
    head = request.head
    if case["traced"]:
        state = case.get("state")
        head = heads.traced_head(head, b"ROUTER", None if state is None else state.encode())
    assert head.endswith(b"\r\n\r\n") and head.count(b"\r\n\r\n") == 1
    lines = head.decode().split("\r\n")
    trace = [line for line in lines if line.split(":")[0].lower() in ("traceparent", "tracestate")]
    assert trace == case["up"]
    assert "x-drop: 1" not in lines


@pytest.mark.parametrize("case", casefiles.params([c for c in CONTEXT if c["traced"]]))
def test_the_forwarded_grpc_headers_carry_one_trace_context(case: dict[str, Any]) -> None:
    sent = [(name.lower(), value) for name, value in _headers(case["sent"])]  # HTTP/2 names are lowercase
    state = case.get("state")
    out = rules.traced(sent, b"ROUTER", None if state is None else state.encode())
    trace = [f"{n.decode()}: {v.decode()}" for n, v in out if n in rules.TRACE_CONTEXT]
    assert trace == case["up"]
    assert [h for h in out if h[0] not in rules.TRACE_CONTEXT] == [h for h in sent if h[0] not in rules.TRACE_CONTEXT]


@pytest.mark.parametrize("case", casefiles.params(ATTRIBUTES["http"]))
def test_http_attributes(case: dict[str, Any]) -> None:
    args = case["args"]
    websocket = args.pop("websocket")
    keep_query = args.pop("keep_query", False)
    assert spans.http_start(**args, port=80, websocket=websocket, keep_query=keep_query) == case["expect"]


@pytest.mark.parametrize("case", casefiles.params(ATTRIBUTES["grpc"]))
def test_grpc_name_and_attributes(case: dict[str, Any]) -> None:
    name, attrs = spans.grpc_start(case["path"], case["authority"], port=80)
    assert name == case["name"]
    for key, value in case["expect"].items():
        assert attrs[key] == value
    assert ("rpc.service" in attrs) == ("rpc.service" in case["expect"])
    assert ("url.query" in attrs) == ("url.query" in case["expect"])


# -- query strings: every value redacted, every key kept ---------------------------------------------
# Values always start with SENTINEL, which no generated key or path can contain (keys are lowercase,
# digits, a few marks and %XX with uppercase hex), so any piece of a value left in a span shows.
SENTINEL = "Zq"
KEY_CHARS = "abcdk_-.~;!$'()*,/:@?"
VALUE_CHARS = "abcXYZ0189-._~;=#?/:@!$'()*,+ &%\u00e9\u20ac"


def _encoded(chars: str, draw: st.DrawFn, alphabet: str) -> str:
    """``chars`` written as a client might: each character literal where it may be, else (or by
    choice) percent-encoded as UTF-8, a space as ``+`` or ``%20``."""
    out = []
    for char in chars:
        literal_ok = char not in "&+%" and char.isascii() and char != " "
        how = draw(st.sampled_from(["literal", "percent", "plus"]))
        if char == " " and how == "plus":
            out.append("+")
        elif literal_ok and how == "literal":
            out.append(char)
        else:
            out.append("".join(f"%{b:02X}" for b in char.encode()))
    return "".join(out)


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A query string (keys repeated, empty values, keys alone, empty fields, ``;`` and ``#`` inside,
    ``+`` and percent-encoding) and the raw text of each value it carries."""
    pool = draw(st.lists(st.text(KEY_CHARS, min_size=1, max_size=6), min_size=1, max_size=4))
    fields, raw_values = [], []
    for _ in range(draw(st.integers(1, 8))):
        key = _encoded(draw(st.sampled_from(pool)), draw, KEY_CHARS)
        shape = draw(st.sampled_from(["value", "value", "empty", "key-alone", "empty-field"]))
        if shape == "value":
            raw = SENTINEL + _encoded(draw(st.text(VALUE_CHARS, max_size=12)), draw, VALUE_CHARS)
            raw_values.append(raw)
            fields.append(f"{key}={raw}")
        elif shape == "empty":
            fields.append(f"{key}=")
        elif shape == "key-alone":
            fields.append(key)
        else:
            fields.append("")
    query = "&".join(fields)
    if draw(st.booleans()):  # a fragment a raw client left on: part of the last field's value
        fragment = SENTINEL + draw(st.text("abc#?=;", max_size=6))
        raw_values.append(fragment)
        query += "#" + fragment
    return query, raw_values


def _oracle_values(query: str) -> list[str]:
    return [v for _, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if v]


@given(queries())
def test_no_query_value_reaches_a_span_and_every_key_does(generated: tuple[str, list[str]]) -> None:
    """Generated query strings in an HTTP request's target and a gRPC ``:path``: no value the oracle
    (``urllib.parse.parse_qsl``) finds, decoded or raw, is anywhere in the span's name or attributes;
    the recorded query has the same keys in the same order, each value ``REDACTED``. With
    ``keep_query`` the query is recorded as sent."""
    query, raw_values = generated
    http = spans.http_start("GET", "/v1/x?" + query, "1.1", "h", "c", port=80, websocket=False)
    name, grpc = spans.grpc_start("/svc/M?" + query, None, port=80)
    recorded = [str(v) for v in (*http.values(), *grpc.values(), name)]
    secrets = [*_oracle_values(query), *raw_values]
    for text in recorded:
        assert SENTINEL not in text, (query, text)
        for secret in secrets:
            assert secret not in text, (query, secret, text)
    sent = query.partition("#")[0]  # a fragment is never recorded, in the path or the query
    kept = urllib.parse.parse_qsl(sent, keep_blank_values=True)
    for attrs in (http, grpc):
        redacted = urllib.parse.parse_qsl(str(attrs.get("url.query", "")), keep_blank_values=True)
        assert [k for k, _ in redacted] == [k for k, _ in kept], (query, attrs)
        assert all(v in ("", spans.REDACTED) for _, v in redacted), (query, attrs)
    asked = spans.http_start("GET", "/v1/x?" + query, "1.1", "h", "c", port=80, websocket=False, keep_query=True)
    assert asked.get("url.query", "") == sent


@pytest.mark.parametrize("case", casefiles.params(ATTRIBUTES["errors"]))
def test_which_spans_are_errors(case: dict[str, Any]) -> None:
    assert spans.http_error(case["outcome"], case["status"]) == case["http"]
    assert spans.grpc_error(case["outcome"], case["status"]) == case["grpc"]


def test_the_router_s_own_attributes() -> None:
    assert spans.ending("completed", chunks=3, sent_bytes=120, ttfb=0.0123456789) == {
        "drain_router.outcome": "completed",
        "drain_router.response.chunks": 3,
        "drain_router.response.bytes": 120,
        "drain_router.time_to_first_byte_s": 0.012346,
    }
    assert "drain_router.time_to_first_byte_s" not in spans.ending("client_aborted", chunks=0, sent_bytes=0, ttfb=None)


def test_a_full_queue_counts_its_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's batch processor with a queue of 4 and an exporter stuck on its first batch: of 10
    spans, 1 is taken (being exported), 4 wait, 5 are dropped and counted."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from drain_router.tracing import sdk

    release = threading.Event()
    taking = threading.Event()

    class Stuck(SpanExporter):
        def export(self, batch: Sequence[Any]) -> SpanExportResult:
            taking.set()
            release.wait(10)
            return SpanExportResult.SUCCESS

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    drops: list[int] = []
    tracing = sdk.Tracing("test", drops.append, exporter=Stuck())
    try:
        span, _, _ = tracing.server("GET", [], [])
        tracing.end(span, {}, None)
        assert taking.wait(10)
        for _ in range(9):
            span, _, _ = tracing.server("GET", [], [])
            tracing.end(span, {}, None)
        assert sum(drops) == 5
    finally:
        release.set()
        tracing.shutdown()
