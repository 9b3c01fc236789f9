"""The front as a process: its own drain and its spans, black-box (real processes, a real OTLP
receiver).

1. SIGTERM: ``/readyz`` answers 503 at once while it keeps serving for ``--shutdown-drain-secs``; a
   stream in flight through it runs to its end; it exits 0.
2. ``--tracing``: a request through the front is a span, and a continued stream's span carries one
   ``drain_router.continued`` event per continuation.
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp

from drain_router.decisions import spans
from drain_router_dev.process import wait_until
from tests import otlp
from tests.front.rig import Rig, post, sequence
from tests.front.test_continuing import TOKENS, assert_one_whole_answer, completions, kill_model, stream_and_cut


async def _readyz(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as resp:
        return resp.status


async def test_sigterm_drains_the_front_and_lets_a_stream_finish() -> None:
    async with Rig() as rig:
        pod = await rig.pod()
        front = await rig.front(pod, shutdown_drain_secs=1)
        assert front.admin_port is not None and front.port is not None
        started = asyncio.Event()
        body = completions(max_tokens=40, interval_ms=50)  # 2 s: past the 1 s drain window
        task = asyncio.ensure_future(post(front.port, "/v1/completions", body, started=started))
        await started.wait()
        front.signal(signal.SIGTERM)
        await wait_until(lambda: _readyz(front.admin_port), 5, "/readyz 503", until=lambda code: code == 503)
        got = await task
        assert got.status == 200 and got.events[-1] == "[DONE]"
        assert got.text() == sequence(0, 40)
        assert await front.wait(10) == 0
        drained = await front.wait_event("drain.complete")
        assert (drained["exit_code"], drained["inflight"]) == (0, 0)


async def test_a_continued_stream_is_one_span_with_its_continuation() -> None:
    async with otlp.running() as receiver, Rig() as rig:
        pods = [await rig.pod(), await rig.pod()]
        front = await rig.front(*pods, tracing=True, env=otlp.environment(receiver.endpoint))
        got = await stream_and_cut(front, pods, "/v1/completions", completions(), kill_model)
        assert_one_whole_answer(got)
        assert got.text() == sequence(0, TOKENS)
        [span] = await receiver.wait_spans(1, **{"url.path": "/v1/completions"})
        assert span.events.count(spans.CONTINUED) == 1
