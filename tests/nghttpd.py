"""The reference HTTP/2 server, ``nghttpd --no-tls`` (Debian package ``nghttp2-server``), serving a
directory on a free loopback port: the conformance suite's reference target, and a real HTTP/2
upstream for the router (its answers carry a ``content-length``, a HEAD's too, with no content)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

from drain_router_dev.process import free_port

START_SECS = 10.0


def available() -> bool:
    return shutil.which("nghttpd") is not None


@contextlib.asynccontextmanager
async def serving(docroot: Path) -> AsyncIterator[int]:
    """``nghttpd --no-tls`` serving ``docroot`` on a free loopback port, until it accepts connections."""
    for _ in range(3):  # a port taken between free_port() and nghttpd's bind: try another
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            "nghttpd",
            "--no-tls",
            "-a",
            "127.0.0.1",
            "-d",
            str(docroot),
            str(port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            if await _accepting(port, proc):
                yield port
                return
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    raise AssertionError("nghttpd did not start")


async def _accepting(port: int, proc: asyncio.subprocess.Process) -> bool:
    deadline = time.monotonic() + START_SECS
    while time.monotonic() < deadline and proc.returncode is None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            try:
                await asyncio.wait_for(proc.wait(), 0.05)  # exited (port taken), or still starting
            except TimeoutError:
                pass
            continue
        writer.close()
        await writer.wait_closed()
        return True
    return False
