"""Why a client connection is not being read: one bit per reason, set and cleared by whoever has the
reason (the client itself, the request's exchange, the upstream connection it writes to). Reading
resumes when no bit is left, so no reason can resume what another still holds."""

from __future__ import annotations

from typing import Protocol

UPLOAD = 1
"""The model server reads an upload slower than the client sends it."""
PIPELINE = 2
"""Pipelined requests wait for their turn (what follows them is not parsed)."""
PENDING = 4
"""A request body arrived while its upstream connection is still being opened."""


class Reader(Protocol):
    """A client connection, as those below it pause and resume its reading."""

    def pause_reading(self, reason: int) -> None: ...

    def resume_reading(self, reason: int) -> None: ...
