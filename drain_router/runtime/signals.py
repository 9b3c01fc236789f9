"""Terminating signals, captured the way uvicorn's ``capture_signals`` does: plain ``signal.signal``
handlers, installed for the duration of a ``with`` block and restored after it.

The entry point (:mod:`drain_router.entry`, through :mod:`drain_router.early_signals`) records SIGTERM and SIGINT from the first moment of the
process; :func:`capture` takes over from it: it replays what was recorded, dispatches every later
signal onto the event loop, and on exit puts back whatever handlers were there before.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

CAPTURED = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def capture(
    loop: asyncio.AbstractEventLoop, handler: Callable[[int], None], *, pending: Iterable[int] = ()
) -> Iterator[None]:
    """Send SIGTERM and SIGINT to ``handler(signum)`` on ``loop``, after replaying ``pending``."""

    def dispatch(signum: int, _frame: Any) -> None:
        loop.call_soon_threadsafe(handler, signum)

    previous = {sig: signal.signal(sig, dispatch) for sig in CAPTURED}
    try:
        for sig in list(pending):
            handler(sig)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
