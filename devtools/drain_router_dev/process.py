"""Child processes for the demo, e2e, the tests and the bench: one way to start, watch and stop them.

Each process runs in its own session (process group) with its output in a log file, so
:meth:`Process.kill` can always take the whole group down, whatever happened to the caller. Waiting is
polling with an explicit deadline, never a bare sleep. Standard library only: the demo ships it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

LOOPBACK = "127.0.0.1"
POLL_SECS = 0.02
"""How often :func:`wait_until` looks again."""

T = TypeVar("T")


class ProcessFailed(RuntimeError):
    """A process exited or did not become ready in time. The message carries its log's tail."""


_HANDED_OUT: set[int] = set()
_PICK = random.Random()
"""Seeded by the OS: two test runs on one machine pick different ports."""


#: The lowest port :func:`free_port` hands out (below it: the well-known and registered services a
#: machine may run).
FIRST_PORT = 10_000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default when unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing is bound to right now, below the kernel's ephemeral range, and never one this
    process handed out before (a replica whose admin port equals its main port refuses to start).

    Below the ephemeral range because a process is often restarted on the port it was given (a pod
    coming back, a model server after a crash): a port from that range may meanwhile become the
    local port of any outgoing connection on the machine (another test run's clients too), and the
    restarted process could not bind it. Only an explicit bind takes a port below it."""
    low = _ephemeral_range()[0]
    for _ in range(1000):
        port = _PICK.randrange(FIRST_PORT, low) if low > FIRST_PORT + 1000 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port after 1000 tries")


@overload
async def wait_until(
    check: Callable[[], Awaitable[T]], timeout: float | None, what: str, *, until: Callable[[T], object] = ...
) -> T: ...
@overload
async def wait_until(
    check: Callable[[], T], timeout: float | None, what: str, *, until: Callable[[T], object] = ...
) -> T: ...
async def wait_until(
    check: Callable[[], Any], timeout: float | None, what: str, *, until: Callable[[Any], object] = bool
) -> Any:
    """Call ``check`` (a plain function or a coroutine function) every :data:`POLL_SECS` until
    ``until`` holds for what it returns (by default: until that is truthy), and return that. After
    ``timeout`` s (``None``: no deadline), ``TimeoutError`` naming ``what`` and the last value seen
    (unless a bool: ``False`` says nothing more). The one polling loop of the tools, the tests and e2e.

    An exception from ``check`` propagates at once, not retried: a check that expects a transient
    error (a refused connection while a server starts) catches it and returns false, so a broken
    check fails on its first call instead of after the whole timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        if deadline is not None and time.monotonic() >= deadline:
            seen = "" if isinstance(value, bool) else f"; last seen: {value!r}"
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}{seen}")
        await asyncio.sleep(POLL_SECS)


@dataclasses.dataclass(slots=True)
class Process:
    """One child process in its own process group, its stdout and stderr in ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    """The child's whole environment; ``None``: this process's."""
    cwd: Path | None = None
    preexec_fn: Callable[[], Any] | None = None
    """Run in the child before ``exec`` (an rlimit, a CPU affinity)."""
    popen: subprocess.Popen[bytes] | None = None
    _read_at: int = dataclasses.field(default=0, init=False, repr=False)

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {' '.join(self.argv)}\n".encode())
            log.flush()
            self._read_at = log.tell()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=None if self.env is None else dict(self.env),
                cwd=self.cwd,
                preexec_fn=self.preexec_fn,
            )

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process itself (not its group), as the kubelet's runtime does."""
        self._started().send_signal(sig)

    async def wait_exit(self, timeout: float | None) -> int:
        """Wait for the process to exit; its return code. ``TimeoutError`` if it did not in ``timeout`` s."""
        popen = self._started()

        async def exited() -> bool:
            return popen.poll() is not None

        await wait_until(exited, timeout=timeout, what=f"{self.name} to exit")
        rc = popen.poll()
        assert rc is not None
        return rc

    def stop(self, sig: int | None = None, timeout: float = 10.0) -> int | None:
        """Send ``sig`` (default SIGTERM), wait up to ``timeout`` s, then SIGKILL the group. The return
        code (``None``: never started). Blocking: for callers without an event loop."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM if sig is None else sig)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it. Safe to call any time, any number of times."""
        if self.popen is None or self.popen.poll() is not None:
            return  # never started, or already exited and reaped (its pid may belong to another now)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)

    def new_lines(self) -> list[str]:
        """The complete lines the process wrote since the last call (since its start, the first time)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._read_at)
                data = log.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._read_at += end
        return data[:end].decode(errors="replace").splitlines()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failed(self, why: str) -> ProcessFailed:
        return ProcessFailed(f"{self.name}: {why}; return code {self.returncode}; log tail:\n{self.log_tail()}")

    def _started(self) -> subprocess.Popen[bytes]:
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.popen
