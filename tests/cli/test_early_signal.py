"""A SIGTERM in the first moments of the process is honoured, not fatal.

Python itself needs some milliseconds before any code can install a handler; a signal in that window
gets the default action, and nothing can do better than installing one as the first thing the
program does. So the tests check, deterministically (no clock): that the real entry point has run
nothing but the ``drain_router`` package and ``drain_router.entry`` when its recorder is installed; and that a
SIGTERM at each later stage of the startup (the process stops itself there, the test signals it
while it is stopped, then lets it go on) ends in a clean exit 0, never 143/-15 (killed by the
default action), and without binding.
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys

import pytest

from tests import process

RECORDER_PROBE = """\
import os, signal, sys
before = []
def hook(event, args):
    if event != "import":
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        before.append(args[0])
    else:
        print(repr((before, args[0])), flush=True)
        os._exit(0)
sys.addaudithook(hook)
script = sys.argv[1]
sys.argv = sys.argv[1:]
exec(compile(open(script).read(), script, "exec"), {"__name__": "__main__"})
"""
"""Runs the console script and prints what was imported before SIGTERM had a handler, then exits
at the first import after it (the entry point's next step: the CLI). It imports nothing itself
beyond what the interpreter has loaded at start and ``signal`` (the recorder's own import)."""


def test_the_recorder_is_installed_before_anything_but_the_entry_module() -> None:
    """Imports while SIGTERM still has its default action, through the installed console script (the
    image's entry point): from the project only ``drain_router``, ``drain_router.entry`` and its recorder, nothing third-party,
    and none of the slow standard library (asyncio, logging, json, sockets)."""
    script = process.console_script()
    if script is None:
        pytest.skip("no drain-router console script next to this interpreter")
    argv = [sys.executable, "-c", RECORDER_PROBE, str(script), "serve", "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    before, first_after = ast.literal_eval(done.stdout)
    assert {m for m in before if m.split(".")[0] not in sys.stdlib_module_names} == {
        "drain_router",
        "drain_router.entry",
        "drain_router.early_signals",
    }
    slow = {"asyncio", "json", "logging", "socket", "ssl", "subprocess", "email", "importlib.metadata"}
    assert not [m for m in before if m in slow or m.split(".")[0] in slow], before
    assert first_after == "drain_router.cli", "the recorder comes before the CLI is loaded"


@pytest.mark.parametrize(
    "stage",
    ["drain_router.cli", "click", "drain_router.config", "drain_router.runtime.lifecycle", "aiohttp", "uvloop"],
)
async def test_sigterm_at_each_stage_of_startup_is_honoured(stage: str) -> None:
    """The router stopped as it first imports ``stage`` (from right after the recorder to the event
    loop's modules), SIGTERM, continued: exit 0 after a drain that never bound a port."""
    p = await process.RouterProcess.start(
        "--upstream", "http://127.0.0.1:9", "--shutdown-drain-secs", "5", entry=process.held_entry(stage)
    )
    try:
        await p.wait_stopped()
        p.signal(signal.SIGTERM)  # pending while it is stopped, delivered as it resumes
        p.signal(signal.SIGCONT)
        assert await p.wait(15) == 0, f"SIGTERM at the import of {stage} was not honoured; saw {p.names()}"
        assert "startup.listening" not in p.names(), "a signal before the bind means no bind at all"
    finally:
        await p.kill()


def test_the_entry_point_loads_nothing_heavy_before_its_recorder() -> None:
    """What the console script imports before the recorder is installed: the ``drain_router`` package and
    ``drain_router.entry`` only; no click, no configuration, no event loop, no aiohttp, no structlog."""
    probe = (
        "import sys; import drain_router.entry; "
        "print(','.join(m for m in ('click', 'drain_router.config', 'drain_router.cli', 'aiohttp', 'uvloop', 'structlog',"
        " 'drain_router.proxy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded before the recorder: {done.stdout.strip()}"
