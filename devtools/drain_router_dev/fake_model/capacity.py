"""The fake model's capacity model: continuous batching, where every stream shares the engine. Pure.

An engine generates one token for every sequence in its batch per step, and a step takes longer as
the batch grows past what the hardware does in parallel. Here that is one number, the batch size
``B``: up to ``B`` concurrent streams each get a token every ``interval_ms``; past it the engine's
token rate is shared, so with ``k`` streams each one's token interval is
``interval_ms * max(1, k / B)`` (the aggregate rate is capped at ``B`` tokens per ``interval_ms``).
``B`` = 0 is an engine without a limit: every stream keeps ``interval_ms`` however many there are.
"""

from __future__ import annotations


def token_interval_ms(interval_ms: float, streams: int, batch_size: int) -> float:
    """One stream's time per token with ``streams`` generating at once (itself included)."""
    if batch_size <= 0 or streams <= batch_size:
        return float(interval_ms)
    return interval_ms * streams / batch_size
