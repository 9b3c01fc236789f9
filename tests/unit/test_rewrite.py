"""The pure head rewriting of the traffic path (drain_router.http1.heads), by table."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest

from drain_router.http1 import answers, heads
from tests import casefiles


def _headers(rows: list[list[str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in rows]


@pytest.mark.parametrize("case", casefiles.params(casefiles.load("framing/responses.yaml")))
def test_client_head(case: dict[str, Any]) -> None:
    def frame() -> heads.ClientHead:
        return heads.client_head(
            case["status"],
            _headers(case["headers"]),
            head_request=case.get("head_request", False),
            http10=case.get("http10", False),
            close=case.get("close", False) and not case.get("http10", False),
        )

    if case.get("unframable"):
        with pytest.raises(heads.BadFraming):
            frame()
        return
    head, mode, until_eof, close = frame()
    assert mode == getattr(heads, case["mode"])
    assert until_eof == case.get("until_eof", False)
    assert close == case.get("close", False)
    text = head.decode()
    phrase = HTTPStatus(case["status"]).phrase
    assert text.startswith(f"HTTP/1.1 {case['status']} {phrase}\r\n") and text.endswith("\r\n\r\n")
    lines = text.split("\r\n")
    for line in case.get("has", []):
        assert line in lines, (line, lines)
    for fragment in case.get("lacks", []):
        assert not any(fragment.lower() in seen.lower() for seen in lines), (fragment, lines)


def _request(headers: list[list[str]], peer: bytes = b"10.0.0.7") -> tuple[heads.RequestHead, list[str]]:
    head = heads.request_head(
        b"POST", b"/v1/completions?x=1", _headers(headers), peer, heads.forwarded_node(peer), b"127.0.0.1:8000"
    )
    return head, head.head.decode().split("\r\n")


def test_request_head_appends_this_hop_and_drops_hop_by_hop() -> None:
    head, lines = _request(
        [
            ["Host", "api.example"],
            ["X-Forwarded-For", "1.2.3.4"],
            ["X-Forwarded-Proto", "https"],
            ["X-Real-IP", "6.6.6.6"],
            ["Forwarded", "for=1.2.3.4"],
            ["Connection", "keep-alive, X-Drop"],
            ["X-Drop", "d"],
            ["TE", "trailers"],
            ["Content-Length", "5"],
        ]
    )
    assert lines[0] == "POST /v1/completions?x=1 HTTP/1.1"
    assert "Host: api.example" in lines
    assert "X-Forwarded-For: 1.2.3.4, 10.0.0.7" in lines
    assert "X-Forwarded-Proto: http" in lines and "X-Forwarded-Proto: https" not in lines
    assert "X-Forwarded-Host: api.example" in lines
    assert "Forwarded: for=1.2.3.4, for=10.0.0.7;proto=http;host=api.example" in lines
    assert not any(line.lower().startswith(("x-drop", "te:", "connection", "x-real-ip")) for line in lines)
    assert (head.content_length, head.chunked, head.hosts) == (5, False, 1)


def test_request_head_without_host_sends_the_upstreams() -> None:
    head, lines = _request([], peer=b"::1")
    assert "Host: 127.0.0.1:8000" in lines and head.hosts == 0
    assert 'Forwarded: for="[::1]";proto=http' in lines


def test_request_head_keeps_the_clients_transfer_codings_and_drops_its_length() -> None:
    head, lines = _request([["Host", "h"], ["Transfer-Encoding", "gzip, chunked"]])
    assert "Transfer-Encoding: gzip, chunked" in lines
    assert head.chunked and head.content_length is None


@pytest.mark.parametrize(
    ("method", "target", "ok"),
    [
        (b"GET", b"/v1/models", True),
        (b"GET", b"/@evil:6443/x", True),
        (b"GET", b"//evil/x", True),
        (b"GET", b"http://evil/x", False),
        (b"OPTIONS", b"*", False),
        (b"CONNECT", b"evil:443", False),
        (b"CONNECT", b"/x", False),
    ],
)
def test_only_origin_form_targets(method: bytes, target: bytes, ok: bool) -> None:
    if ok:
        heads.check_target(method, target)
    else:
        with pytest.raises(heads.BadTarget):
            heads.check_target(method, target)


@pytest.mark.parametrize(
    ("method", "headers", "retry"),
    [
        (b"GET", [], True),
        (b"DELETE", [], True),
        (b"POST", [], False),
        (b"PUT", [["Content-Length", "3"]], False),
        (b"GET", [["Transfer-Encoding", "chunked"]], False),
    ],
)
def test_only_idempotent_requests_without_a_body_are_retried(
    method: bytes, headers: list[list[str]], retry: bool
) -> None:
    head = heads.request_head(method, b"/", _headers([["Host", "h"], *headers]), b"p", b"p", b"u")
    assert heads.retryable(method, head) is retry


@pytest.mark.parametrize(
    "connection",
    ["content-length", "Content-Length, keep-alive", "transfer-encoding", "close, Transfer-Encoding", "host", "HOST"],
)
def test_a_request_nominating_a_framing_header_is_refused(connection: str) -> None:
    with pytest.raises(heads.BadFraming):
        _request([["Host", "h"], ["Content-Length", "5"], ["Connection", connection]])


def test_an_interim_response_keeps_its_end_to_end_headers_only() -> None:
    head = heads.interim_head(
        103, _headers([["Link", "</s.css>; rel=preload"], ["Connection", "x-hop"], ["X-Hop", "1"], ["Keep-Alive", "5"]])
    )
    assert head == b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [[["Content-Length", "5"]], [["content-length", "0"]], [["Transfer-Encoding", "chunked"]]],
)
def test_an_interim_response_never_carries_framing_headers(framing: list[list[str]]) -> None:
    head = heads.interim_head(103, _headers([["Link", "</s.css>; rel=preload"], *framing]))
    assert head == b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (413, b"HTTP/1.1 413 Content Too Large\r\n"),  # RFC 9110's name, where Python 3.11 has RFC 7231's
        (422, b"HTTP/1.1 422 Unprocessable Content\r\n"),
        (200, b"HTTP/1.1 200 OK\r\n"),
        (599, b"HTTP/1.1 599 Unknown\r\n"),
    ],
)
def test_relayed_and_own_heads_share_one_status_line(status: int, line: bytes) -> None:
    relayed, *_ = heads.client_head(status, [], head_request=False, http10=False, close=False)
    assert relayed.startswith(line)
    assert answers.error(status, "x", "y", close=True).startswith(line)
