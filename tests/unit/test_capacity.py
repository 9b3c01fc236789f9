"""Admission control's pure decisions (:mod:`drain_router.decisions.capacity`), as tables: the
Retry-After estimate and its headers, the mean hold time, what a request past N gets, which
requests are exempt."""

from __future__ import annotations

import pytest

from drain_router.decisions import capacity
from drain_router.decisions.capacity import Verdict
from drain_router.decisions.grpc_status import GrpcStatus
from tests import casefiles


@pytest.mark.parametrize("case", casefiles.params(casefiles.load("admission/retry-after.yaml")))
def test_retry_after(case):
    seconds = capacity.retry_after(case["queued"], case["limit"], case["hold"], leaving=case["leaving"])
    assert seconds == pytest.approx(case["seconds"])
    assert capacity.headers(seconds) == (case["retry_after"], case["ms"])


@pytest.mark.parametrize(
    ("previous", "held", "mean"),
    [
        (None, 3.0, 3.0),  # the first release is the mean
        (2.0, 2.0, 2.0),  # steady
        (2.0, 12.0, 3.0),  # one long stream moves it by a tenth of the difference
        (10.0, 0.0, 9.0),  # and one instant refusal-free release the other way
    ],
)
def test_mean_hold(previous, held, mean):
    assert capacity.mean_hold(previous, held) == pytest.approx(mean)


def test_the_estimate_follows_a_slower_model_server():
    hold = None
    for _ in range(30):
        hold = capacity.mean_hold(hold, 1.0)
    fast = capacity.retry_after(4, 1, hold, leaving=False)
    for _ in range(30):
        hold = capacity.mean_hold(hold, 4.0)
    assert capacity.retry_after(4, 1, hold, leaving=False) > 3 * fast


@pytest.mark.parametrize(
    ("queued", "size", "closing", "verdict"),
    [
        (0, 256, False, Verdict.WAIT),
        (255, 256, False, Verdict.WAIT),
        (256, 256, False, Verdict.QUEUE_FULL),
        (0, 0, False, Verdict.QUEUE_FULL),  # --queue-size 0: no queue
        (0, 256, True, Verdict.CLOSING),  # closing: nothing waits any more
        (256, 256, True, Verdict.CLOSING),
    ],
)
def test_arrival(queued, size, closing, verdict):
    assert capacity.arrival(queued, size, closing=closing) is verdict


@pytest.mark.parametrize(
    ("method", "path", "exempt"),
    [
        (b"GET", b"/health", True),
        (b"HEAD", b"/v1/models", True),
        (b"GET", b"/ready", True),  # the upstream health path joins the list
        (b"POST", b"/v1/models", False),  # only reads
        (b"GET", b"/v1/models/x", False),  # exact match
        (b"GET", b"/v1/chat/completions", False),
    ],
)
def test_exempt(method, path, exempt):
    paths = capacity.exempt_paths(("/health", "/v1/models"), "/ready")
    assert capacity.exempt(method, path, paths) is exempt


def test_every_refusal_has_an_http_and_a_grpc_answer():
    for reason in capacity.REASONS:
        status, _, _, close = capacity.HTTP_ANSWERS[reason]
        grpc_status, _ = capacity.GRPC_ANSWERS[reason]
        assert (status, close) == ((429, False) if reason == "queue_full" else (503, reason == "closing"))
        assert grpc_status == (GrpcStatus.UNAVAILABLE if reason == "closing" else GrpcStatus.RESOURCE_EXHAUSTED)
