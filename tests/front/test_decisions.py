"""The front's pure decisions (:mod:`drain_router.decisions.front`), by tables: which answers are
retried, how a pod says it leaves, which pod is picked, how an event stream is cut into events (the
OpenAI SDK's decoder as the oracle), the head of a request sent again, and the pods an API server
lists."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from drain_router.decisions import front

MARK = b"x-drain-router-refused"


@pytest.mark.parametrize(
    ("status", "headers", "reason"),
    [
        (503, [(MARK, b"closing")], "closing"),
        (503, [(b"X-Drain-Router-Refused", b"queue_timeout")], "queue_timeout"),
        (502, [(MARK, b"upstream_unavailable")], "upstream_unavailable"),
        (504, [(MARK, b"upstream_timeout")], "upstream_timeout"),
        (503, [(MARK, b"")], "refused"),
        (429, [(MARK, b"queue_full")], None),  # a full pod: a retry would multiply the overload
        (503, [(b"retry-after", b"1")], None),  # the model server's own 503: it saw the request
        (502, [], None),
        (200, [(b"x-drain-router-refusedx", b"closing")], None),
    ],
)
def test_retry_reason(status: int, headers: list[tuple[bytes, bytes]], reason: str | None) -> None:
    assert front.retry_reason(status, headers) == reason


@pytest.mark.parametrize(
    ("headers", "leaving"),
    [
        ([(b"connection", b"close")], True),
        ([(b"Connection", b"Close")], True),
        ([(b"connection", b"keep-alive, close")], True),
        ([(b"connection", b"keep-alive")], False),
        ([(b"x-connection", b"close")], False),
        ([], False),
    ],
)
def test_closes(headers: list[tuple[bytes, bytes]], leaving: bool) -> None:
    assert front.closes(headers) is leaving


@pytest.mark.parametrize(
    ("loads", "turn", "picked"),
    [
        ([3, 1, 2], 0, 1),
        ([1, 1, 1], 0, 0),
        ([1, 1, 1], 1, 1),
        ([1, 1, 1], 5, 2),
        ([None, 5, None], 0, 1),
        ([None, None], 3, None),
        ([], 0, None),
        ([0, None, 0], 1, 2),
    ],
)
def test_least_loaded(loads: list[int | None], turn: int, picked: int | None) -> None:
    assert front.least_loaded(loads, turn) == picked


def _sdk_events(stream: bytes) -> list[str]:
    """What the OpenAI SDK's decoder reads from ``stream``: each event's data."""
    return [event.data for event in SSEDecoder().iter_bytes(iter([stream])) if event.data]


event_texts = st.lists(
    st.tuples(
        st.text(alphabet='abc {}:"é', min_size=0, max_size=20),
        st.sampled_from(["\n\n", "\r\n\r\n"]),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@given(events=event_texts, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_events_are_cut_where_the_sdk_cuts_them(events: list[tuple[str, str, bool]], cuts: list[int]) -> None:
    """However the bytes arrive, the splitter hands over whole events, in order, whose data is what
    the SDK reads, and keeps only an event not yet ended."""
    parts = []
    for text, end, comment in events:
        line_end = end[: len(end) // 2]
        parts.append(((": keep-alive" + line_end) if comment else "") + "data: " + text + end)
    stream = "".join(parts).encode()
    splitter = front.EventSplitter()
    got: list[bytes] = []
    start = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        got += splitter.feed(stream[start:cut])
        start = max(start, cut)
    assert b"".join(got) == stream
    assert splitter.rest == b""
    datas = [front.event_data(event) for event in got]
    assert [d.decode() for d in datas if d] == _sdk_events(stream)


def test_an_event_not_ended_is_kept_and_bounded() -> None:
    splitter = front.EventSplitter()
    assert splitter.feed(b"data: 1\n\ndata: 2") == [b"data: 1\n\n"]
    assert splitter.rest == b"data: 2"
    assert splitter.feed(b"\n\n") == [b"data: 2\n\n"]
    splitter.feed(b"data: " + b"x" * front.MAX_EVENT_BYTES)
    assert splitter.overflow
    assert len(splitter.take_rest()) == front.MAX_EVENT_BYTES + 6
    assert splitter.rest == b""


@pytest.mark.parametrize(
    ("event", "data"),
    [
        (b"data: {}\n\n", b"{}"),
        (b"data:{}\n\n", b"{}"),
        (b"event: error\ndata: {}\n\n", b"{}"),
        (b"data: a\ndata: b\n\n", b"a\nb"),
        (b"data: a\r\ndata: b\r\n\r\n", b"a\nb"),
        (b": ping\n\n", None),
        (b"id: 4\n\n", None),
    ],
)
def test_event_data(event: bytes, data: bytes | None) -> None:
    assert front.event_data(event) == data


def test_resend_head_keeps_every_header_but_the_framing() -> None:
    head = (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: m\r\nauthorization: Bearer k\r\n"
        b"Content-Length: 12\r\nexpect: 100-continue\r\nx-forwarded-for: 10.0.0.1\r\n\r\n"
    )
    assert front.resend_head(head, b"/v1/completions?x=1", 345) == (
        b"POST /v1/completions?x=1 HTTP/1.1\r\nhost: m\r\nauthorization: Bearer k\r\n"
        b"x-forwarded-for: 10.0.0.1\r\ncontent-length: 345\r\n\r\n"
    )
    chunked = b"POST /v1/completions HTTP/1.1\r\nhost: m\r\ntransfer-encoding: chunked\r\n\r\n"
    assert front.resend_head(chunked, b"/v1/completions", 2) == (
        b"POST /v1/completions HTTP/1.1\r\nhost: m\r\ncontent-length: 2\r\n\r\n"
    )


def _slice(service: str, endpoints: list[dict[str, Any]], **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"kubernetes.io/service-name": service, **labels}},
        "endpoints": endpoints,
    }


def test_endpoints_are_the_pods_of_the_services_not_the_activator() -> None:
    slices = [
        _slice(
            "model",
            [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.1"]},  # no conditions: ready
                {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": False, "terminating": True}},
                {"addresses": ["not-an-ip"]},
                {"addresses": ["fd00::5"], "conditions": {"ready": True}},
            ],
        ),
        _slice(
            "model",
            [{"addresses": ["10.9.9.9"], "conditions": {"ready": True}}],
            **{"endpointslice.kubernetes.io/managed-by": "drain-router.dev"},
        ),
        _slice("other", [{"addresses": ["10.0.0.7"]}]),
    ]
    found = front.endpoints(slices, ["model"])
    assert [(e.address, e.ready) for e in found] == [
        ("10.0.0.1", True),
        ("10.0.0.2", True),
        ("10.0.0.3", False),
        ("fd00::5", True),
    ]
    assert found[3].url(8080) == "http://[fd00::5]:8080"


@pytest.mark.parametrize(
    ("modelservice", "names"),
    [
        (
            {
                "metadata": {"name": "ms"},
                "spec": {
                    "workload": [
                        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
                        {"apiVersion": "v1", "kind": "Service", "name": "svc"},
                        {"apiVersion": "example.com/v1", "kind": "Service", "name": "not-core"},
                    ]
                },
            },
            ["svc"],
        ),
        ({"metadata": {"name": "ms"}, "spec": {}}, ["ms"]),
        ({"metadata": {}}, []),
    ],
)
def test_service_names(modelservice: dict[str, Any], names: list[str]) -> None:
    assert front.service_names(modelservice) == names
