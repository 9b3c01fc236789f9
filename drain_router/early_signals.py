"""The early signal recorder: SIGTERM and SIGINT noted, not fatal, from the process's first moments.

A pod can be deleted while its router is still starting; Python's default SIGTERM action kills the
process (exit 143) and loses the drain. :mod:`drain_router.entry` installs this recorder before it
loads anything else, ``serve`` replays what was recorded on its event loop once it has one, and every
other command gets the default handlers back (and any recorded signal re-raised) before it runs. It
lives apart from the entry point so the CLI can use it without importing the module that imports the
CLI; it imports nothing but ``signal`` until it has to deliver a signal again.
"""

import signal

pending: list[int] = []
"""Signals received since :func:`install`, in order, for ``serve`` to replay."""

EARLY_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _record(signum: int, _frame: object) -> None:
    pending.append(signum)


def install() -> None:
    """Record SIGTERM and SIGINT instead of dying (idempotent)."""
    for sig in EARLY_SIGNALS:
        signal.signal(sig, _record)


def release() -> None:
    """Default handlers back; a signal recorded meanwhile is delivered again, now with its default effect."""
    import os

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in pending:
        os.kill(os.getpid(), sig)
    pending.clear()
