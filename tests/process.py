"""Run ``drain-router serve`` as a real subprocess and read its JSON log lines."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any


class RouterProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self.port: int | None = None
        self.admin_port: int | None = None
        self._reader = asyncio.ensure_future(self._read())
        self._new_event = asyncio.Event()

    @classmethod
    async def start(cls, *args: str, preexec_fn: Any = None) -> RouterProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "router",
            "serve",
            "--host",
            "127.0.0.1",
            "--admin-host",
            "127.0.0.1",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "raw", "line": line}
            if event.get("event") == "startup.listening":
                self.port, self.admin_port = event["port"], event["admin_port"]
            self.events.append(event)
            self._new_event.set()

    async def wait_event(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("event") == name:
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.proc.returncode is not None and self._reader.done()):
                raise AssertionError(f"no {name} event; saw {[e.get('event') for e in self.events]}")
            self._new_event.clear()
            try:
                await asyncio.wait_for(self._new_event.wait(), remaining)
            except TimeoutError:
                pass

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    async def wait(self, timeout: float = 10.0) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await asyncio.wait_for(self._reader, 5)
        return code

    def names(self) -> list[str]:
        return [e.get("event", "") for e in self.events]

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
