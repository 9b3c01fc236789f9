"""Run ``drain-router serve`` as a real subprocess (the shared harness, drain_router_dev.process) and read
its JSON log lines."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from drain_router_dev import process as process_

_LOGS = Path(tempfile.mkdtemp(prefix="router-processes-"))
"""The routers' log files, one directory for the test run, removed at its end."""
atexit.register(shutil.rmtree, _LOGS, ignore_errors=True)
_NUMBERS = itertools.count()


def log_path(name: str) -> Path:
    """A fresh log file for a process named ``name``, in the test run's log directory."""
    return _LOGS / f"{name}-{next(_NUMBERS)}.log"


def serve_argv(*args: str, entry: tuple[str, ...] = (sys.executable, "-m", "drain_router")) -> list[str]:
    """``drain-router serve`` on loopback, both ports picked by the kernel, then ``args``."""
    return [
        *entry,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--admin-host",
        "127.0.0.1",
        "--admin-port",
        "0",
        *args,
    ]


def console_script() -> Path | None:
    """The installed ``drain-router`` console script next to this interpreter, if there is one."""
    script = Path(sys.executable).with_name("drain-router")
    return script if script.exists() else None


_HOLD = """\
import os, runpy, signal, sys
held = []
def hold(event, args):
    if event == "import" and args[0] == {module!r} and not held:
        held.append(args[0])
        os.kill(os.getpid(), signal.SIGSTOP)
sys.addaudithook(hold)
script = {script!r}
if script is None:
    runpy.run_module("router", run_name="__main__", alter_sys=True)
else:
    exec(compile(open(script).read(), script, "exec"), {{"__name__": "__main__"}})
"""


def held_entry(module: str) -> tuple[str, ...]:
    """The router's entry point (the console script, else ``python -m drain_router``), run so that the
    process stops itself (SIGSTOP) as it first imports ``module``: a test can then signal it at exactly
    that point of its startup and let it go on (SIGCONT). Wait for the stop with
    :meth:`RouterProcess.wait_stopped`."""
    script = console_script()
    return (sys.executable, "-c", _HOLD.format(module=module, script=None if script is None else str(script)))


class RouterProcess:
    """A router process and the events it logged; a line that is not JSON is ``{"event": "raw"}``."""

    def __init__(self, proc: process_.Process) -> None:
        self.proc = proc
        self._events: list[dict[str, Any]] = []
        self._listening: dict[str, Any] = {}

    @classmethod
    async def start(
        cls,
        *args: str,
        preexec_fn: Any = None,
        entry: tuple[str, ...] = (sys.executable, "-m", "drain_router"),
        env: dict[str, str] | None = None,
    ) -> RouterProcess:
        """``env``: the child's whole environment (None: this process's)."""
        argv = serve_argv(*args, entry=entry)
        proc = process_.Process("router", argv, log_path("router"), env=env, preexec_fn=preexec_fn)
        proc.start()
        return cls(proc)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event logged so far."""
        self._read()
        return self._events

    def _read(self) -> None:
        for line in self.proc.new_lines():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "raw", "line": line}
            if event.get("event") == "startup.listening":
                self._listening = event
            self._events.append(event)

    @property
    def port(self) -> int | None:
        """The traffic port, once the router logged ``startup.listening``."""
        self._read()
        return self._listening.get("port")

    @property
    def admin_port(self) -> int | None:
        self._read()
        return self._listening.get("admin_port")

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port (``--grpc-port``), once listening."""
        self._read()
        return self._listening.get("grpc_port")

    async def wait_event(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        async def logged() -> bool:
            exited = self.proc.returncode is not None
            found.extend(e for e in self.events if e.get("event") == name)
            if not found and exited:
                raise AssertionError(f"exited without a {name} event; saw {self.names()}")
            return bool(found)

        try:
            await process_.wait_until(logged, timeout=timeout, what=f"a {name} event")
        except TimeoutError:
            raise AssertionError(f"no {name} event; saw {self.names()}") from None
        return found[0]

    async def wait_stopped(self, timeout: float = 10.0) -> None:
        """Wait until the process is stopped (it runs a :func:`held_entry`); Linux only."""

        async def stopped() -> bool:
            if self.proc.returncode is not None:
                raise AssertionError(f"exited ({self.proc.returncode}) instead of stopping; saw {self.names()}")
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] == "T"  # the state field follows the command's name

        try:
            await process_.wait_until(stopped, timeout=timeout, what="the process to stop")
        except TimeoutError:
            raise AssertionError(f"never stopped; saw {self.names()}") from None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.signal(sig)

    async def wait(self, timeout: float | None = 10.0) -> int:
        return await self.proc.wait_exit(timeout)

    def names(self) -> list[str]:
        return [e.get("event", "") for e in self.events]

    async def kill(self) -> None:
        self.proc.kill()


Start = Callable[..., Awaitable[RouterProcess]]


@contextlib.asynccontextmanager
async def router_starter(default_upstream: str) -> AsyncIterator[Start]:
    """A factory of ``drain-router serve`` processes on free ports (drain window 0 unless asked),
    each waited for until listening, all killed on exit."""
    started: list[RouterProcess] = []

    async def start(*args: str, upstream: str | None = None, drain_secs: str = "0") -> RouterProcess:
        p = await RouterProcess.start(
            "--upstream",
            upstream or default_upstream,
            "--port",
            "0",
            "--admin-port",
            "0",
            "--shutdown-drain-secs",
            drain_secs,
            *args,
        )
        started.append(p)
        await p.wait_event("startup.listening")
        return p

    try:
        yield start
    finally:
        for p in started:
            await p.kill()
