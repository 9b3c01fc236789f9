"""Signal capture: replays what the entry point recorded, dispatches later signals onto the loop,
and puts the previous handlers back afterwards."""

from __future__ import annotations

import asyncio
import os
import signal

from drain_router.runtime import signals
from drain_router_dev.process import wait_until


async def test_capture_replays_dispatches_and_restores() -> None:
    def previous(signum: int, frame: object) -> None:
        raise AssertionError("the previous handler must not run while captured")

    before = {sig: signal.signal(sig, previous) for sig in signals.CAPTURED}
    seen: list[int] = []
    try:
        with signals.capture(asyncio.get_running_loop(), seen.append, pending=[signal.SIGINT]):
            assert seen == [signal.SIGINT], "recorded signals are replayed first, in order"
            os.kill(os.getpid(), signal.SIGTERM)
            await wait_until(lambda: len(seen) == 2, 2, "SIGTERM dispatched on the loop")
        assert seen == [signal.SIGINT, signal.SIGTERM]
        assert all(signal.getsignal(sig) is previous for sig in signals.CAPTURED), "previous handlers restored"
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
