"""Out of file descriptors: the traffic side stops at its connection limit, so the admin listener
(liveness, readiness, preStop) keeps answering; refusals are clean 503s, counted and logged, never a
500 or a crash, and the streams already held keep flowing."""

from __future__ import annotations

import asyncio
import collections
import resource
import signal

import aiohttp

from drain_router.runtime import tuning
from drain_router_dev import streams
from drain_router_dev.process import wait_until
from tests.process import RouterProcess

NOFILE = 208  # soft = hard, so the router's own raise to the hard limit cannot lift it
LIMIT = tuning.traffic_connection_limit(NOFILE)  # 44 client connections


def _tight_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


async def test_connection_limit_keeps_admin_answering_and_held_streams_flowing(fake_upstream):
    """1. a router limited to 208 descriptors holds 40 streams  2. 100 idle connections open and stay
    open  3. 60 more streams arrive. Result: the router never runs out of descriptors: connections
    past its limit get a 503 (out_of_file_descriptors) and are closed, never a 500; while every slot
    is taken, /livez and /readyz on the admin port answer 200; the refusals are counted and logged;
    every held stream ends with [DONE]; afterwards the router serves again and drains cleanly.
    (Without the limit, the idle connections alone exhaust the descriptors and the admin listener
    cannot accept its probes.)"""
    p = await RouterProcess.start(
        "--upstream",
        fake_upstream.url,
        "--port",
        "0",
        "--admin-port",
        "0",
        "--shutdown-drain-secs",
        "0",
        preexec_fn=_tight_nofile,
    )
    try:
        listening = await p.wait_event("startup.listening")
        assert listening["connection_limit"] == LIMIT
        base = f"http://127.0.0.1:{p.port}"
        admin = f"http://127.0.0.1:{p.admin_port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s:

            async def stream(n: int) -> object:
                try:
                    async with s.get(f"{base}/sse?n={n}&iv=0.05", timeout=aiohttp.ClientTimeout(total=20)) as resp:
                        if resp.status == 503:
                            assert (await resp.json())["error"]["type"] == "out_of_file_descriptors"
                            assert resp.headers["x-drain-router-refused"] == "out_of_file_descriptors"
                            return 503
                        events = streams.events_of(await resp.read())
                        return "done" if events[-1] == "[DONE]" and len(events) == n + 1 else events
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                    return type(exc).__name__

            holders = [asyncio.ensure_future(stream(60)) for _ in range(40)]
            await wait_until(lambda: fake_upstream.started == 40, 10, "40 held streams")
            idle = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(100)]
            for path in ("/livez", "/readyz"):
                for _ in range(3):
                    async with s.get(admin + path, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        assert resp.status == 200, (path, resp.status)
            burst = [asyncio.ensure_future(stream(40)) for _ in range(60)]
            outcomes = collections.Counter(await asyncio.gather(*burst))
            held = await asyncio.gather(*holders)
            for _, writer in idle:
                writer.close()
        assert held == ["done"] * 40, held
        assert 500 not in outcomes, outcomes
        assert outcomes[503] >= 1, f"connections past the limit are refused: {outcomes}"
        assert set(outcomes) <= {"done", 503, "ClientOSError", "ServerDisconnectedError"}, outcomes
        async with aiohttp.ClientSession() as again:
            async with again.get(f"{base}/sse?n=2&iv=0") as resp:
                assert resp.status == 200
            async with again.get(f"{admin}/metrics") as resp:
                metrics = await resp.text()
        refused = [
            line
            for line in metrics.splitlines()
            if line.startswith('drain_router_connections_refused_total{reason="connection_limit"}')
        ]
        assert refused and float(refused[0].split()[-1]) >= outcomes[503], refused
        assert any(e.get("event") == "proxy.connection_refused" for e in p.events)
        assert p.proc.returncode is None, "the router did not crash"
        p.signal(signal.SIGTERM)
        assert await p.wait() == 0
    finally:
        await p.kill()
