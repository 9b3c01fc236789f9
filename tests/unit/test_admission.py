"""The verdict on a parsed request head, as a table (the raw-socket tests in tests/cli and
tests/conformance check the same rules through a real router)."""

from __future__ import annotations

import pytest

from drain_router.http1 import answers, classify

KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
WS = [(b"Host", b"h"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")]
WS_OK = [*WS, (b"Sec-WebSocket-Key", KEY), (b"Sec-WebSocket-Version", b"13")]


def _admit(method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> classify.Admission:
    return classify.admit(method, url, version, headers, b"10.0.0.7", b"10.0.0.7", b"model:8000")


@pytest.mark.parametrize(
    ("method", "url", "version", "headers", "problem", "close"),
    [
        (b"GET", b"/v1/models", "1.1", [(b"Host", b"h")], None, False),
        (b"GET", b"/v1/models", "1.0", [], None, False),
        (b"GET", b"/v1/models", "0.9", [], answers.BAD_REQUEST, True),
        (b"GET", b"/v1/models", "1.1", [], classify.NO_HOST, True),
        (b"GET", b"/v1/models", "1.1", [(b"Host", b"a"), (b"Host", b"b")], classify.NO_HOST, True),
        (b"GET", b"http://evil/x", "1.1", [(b"Host", b"h")], answers.BAD_TARGET, False),
        (b"CONNECT", b"evil:443", "1.1", [(b"Host", b"h")], answers.BAD_TARGET, True),
        (b"POST", b"/", "1.1", [(b"Host", b"h"), (b"Connection", b"content-length")], classify.NOMINATED, True),
        (b"GET", b"/ws", "1.1", WS, answers.BAD_WEBSOCKET, True),
        (b"POST", b"/ws", "1.1", WS_OK, answers.BAD_WEBSOCKET, True),
        (b"GET", b"/ws", "1.1", [*WS_OK, (b"Content-Length", b"3")], answers.BAD_WEBSOCKET, True),
        (b"GET", b"/ws", "1.1", WS_OK, None, False),
        (b"GET", b"/", "1.1", [(b"Host", b"h"), (b"Connection", b"Upgrade"), (b"Upgrade", b"h2c")], None, False),
    ],
)
def test_admission(
    method: bytes,
    url: bytes,
    version: str,
    headers: list[tuple[bytes, bytes]],
    problem: answers.Error | None,
    close: bool,
) -> None:
    verdict = _admit(method, url, version, headers)
    assert (verdict.problem, verdict.close) == (problem, close)


def test_a_valid_handshake_carries_its_key_and_others_none() -> None:
    assert _admit(b"GET", b"/ws", "1.1", WS_OK).ws_key == KEY
    h2c = [(b"Host", b"h"), (b"Connection", b"Upgrade"), (b"Upgrade", b"h2c")]
    verdict = _admit(b"GET", b"/", "1.1", h2c)
    assert verdict.ws_key is None and verdict.request is not None and verdict.request.upgrade  # 501 in its turn


@pytest.mark.parametrize(
    ("method", "url", "version", "path"),
    [
        (b"GET", b"/readyz", "1.1", b"/readyz"),
        (b"HEAD", b"/livez?x=1", "1.0", b"/livez"),
        (b"POST", b"/readyz", "1.1", None),
        (b"GET", b"/readyz/x", "1.1", None),
        (b"GET", b"/readyz", "0.9", None),
    ],
)
def test_probe_path(method: bytes, url: bytes, version: str, path: bytes | None) -> None:
    assert classify.probe_path(method, url, version) == path
