"""Out of file descriptors: clean 503s, no 500, no crash, the held streams keep flowing."""

from __future__ import annotations

import asyncio
import collections
import resource
import signal

import aiohttp

from tests.conftest import wait_until
from tests.process import RouterProcess
from tests.upstream import sse_events

NOFILE = 64  # soft = hard, so the router's own raise to the hard limit cannot lift it


def _tight_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


async def test_emfile_is_answered_503_and_held_streams_survive(fake_upstream):
    """1. a router limited to 64 descriptors holds 15 streams  2. a burst of 60 more requests.
    Result: each burst request gets 503 (out_of_file_descriptors) or a refused/reset connection,
    never a 500; every held stream still ends with [DONE]; afterwards the router serves again."""
    p = await RouterProcess.start("--upstream", fake_upstream.url, "--port", "0", "--admin-port", "0",
                                  "--shutdown-drain-secs", "0", preexec_fn=_tight_nofile)
    try:
        await p.wait_event("startup.listening")
        base = f"http://127.0.0.1:{p.port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            async def held() -> list[str]:
                async with s.get(f"{base}/sse?n=40&iv=0.05") as resp:
                    assert resp.status == 200
                    return sse_events(await resp.read())

            holders = [asyncio.ensure_future(held()) for _ in range(15)]
            await wait_until(lambda: fake_upstream.started == 15, 10, "15 held streams")

            async def burst() -> object:
                try:
                    async with s.get(f"{base}/sse?n=1", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        if resp.status == 503:
                            assert (await resp.json())["error"]["type"] == "out_of_file_descriptors"
                        else:
                            await resp.read()
                        return resp.status
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, asyncio.TimeoutError) as exc:
                    return type(exc).__name__

            outcomes = collections.Counter(await asyncio.gather(*(burst() for _ in range(60))))
            assert 500 not in outcomes, outcomes
            assert outcomes[503] >= 1, f"the burst should exhaust descriptors: {outcomes}"
            assert set(outcomes) <= {200, 503, "ClientOSError", "ServerDisconnectedError", "TimeoutError"}, outcomes
            results = await asyncio.gather(*holders)
            assert all(events[-1] == "[DONE]" and len(events) == 41 for events in results)
        async with aiohttp.ClientSession() as again, again.get(f"{base}/sse?n=2") as resp:
            assert resp.status == 200
        assert any(e.get("event") == "proxy.emfile" for e in p.events)
        assert p.proc.returncode is None, "the router did not crash"
        p.signal(signal.SIGTERM)
        assert await p.wait() == 0
    finally:
        await p.kill()
