"""``activator.service_key``, ``should_request_wake`` and ``wake_patch``: which ModelService a held
request is for, and how the activator asks for a wake."""

from __future__ import annotations

import pytest

from drain_router.decisions import activator, durations
from drain_router.decisions.activation import ActivationStatus, Phase

T0 = durations.parse_time("2025-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (b"models/llama", ("models", "llama")),
        (b" models/llama-3.1 ", ("models", "llama-3.1")),
        (b"a/b", ("a", "b")),
        (b"models/" + b"a" * 63 + b"." + b"b" * 63, ("models", "a" * 63 + "." + "b" * 63)),
        (b"models", None),  # no namespace
        (b"/llama", None),
        (b"models/", None),
        (b"Models/llama", None),  # upper case
        (b"models/llama/extra", None),
        (b"mo.dels/llama", None),  # a namespace is a label, no dots
        (b"models/-llama", None),
        (b"models/llama-", None),
        (b"models/" + b"a" * 64, None),  # a label longer than 63
        (b"m" * 64 + b"/llama", None),
        (b"models/" + b".".join([b"a" * 63] * 4), None),  # 255 characters: past 253
        (b"models/ll\xc3\xa4ma", None),  # not ASCII
        (b"models/llama\r\nx", None),
        (b"", None),
    ],
)
def test_service_key(value: bytes, key: tuple[str, str] | None) -> None:
    assert activator.service_key(value) == key


@pytest.mark.parametrize(
    ("status", "ask"),
    [
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO), True),
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO, wake_requested_at=T0), False),  # pending: once
        (ActivationStatus(phase=Phase.WAKING, wake_requested_at=T0), False),
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO, wake_requested_at=T0, awoken_at=T0 + 5), True),  # stale
        (ActivationStatus(phase=Phase.ACTIVE, wake_requested_at=T0, awoken_at=T0 + 5), True),  # between steps
    ],
)
def test_a_wake_is_asked_for_once_while_pending(status: ActivationStatus, ask: bool) -> None:
    assert activator.should_request_wake(status) is ask


def test_the_wake_patch_carries_its_precondition() -> None:
    assert activator.wake_patch(T0 + 1.5, "42") == {
        "metadata": {"resourceVersion": "42"},
        "status": {"lifecycle": {"wakeRequestedAt": durations.format_time(T0 + 1.5)}},
    }
