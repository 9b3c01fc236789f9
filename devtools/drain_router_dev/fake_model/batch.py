"""The streams the fake model generates at once, and the pause before each one's next token.

:class:`Batch` counts the generations running now (their silent prefill included: a sequence holds
its place in an engine's batch from its prefill on) and paces each token by
:func:`.capacity.token_interval_ms`. The pace is recomputed whenever a stream joins or leaves: a
pause is the time left to finish the token at the current rate, so a stream that joins halfway
through another's token slows only its second half, and one that leaves speeds up the rest of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from drain_router_dev.fake_model import capacity


class Batch:
    """The generations running now (``streams``), and a way to wait for the next token among them."""

    def __init__(self) -> None:
        self.streams = 0
        self._changed = asyncio.Event()

    def _change(self, by: int) -> None:
        self.streams += by
        self._changed.set()  # every pause in progress recomputes its rate...
        self._changed = asyncio.Event()  # ...and waits on the next change from then on

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """One stream in the batch while the block runs, whatever ends it."""
        self._change(+1)
        try:
            yield
        finally:
            self._change(-1)

    async def pause(self, interval_ms: float, batch_size: int) -> None:
        """Wait for one token of a stream in the batch: ``interval_ms`` stretched by the load
        (:func:`.capacity.token_interval_ms`), recomputed each time a stream joins or leaves."""
        if batch_size <= 0:
            await asyncio.sleep(interval_ms / 1000)
            return
        loop = asyncio.get_running_loop()
        left = 1.0  # the fraction of the token still to generate
        while left > 0:
            per_token = capacity.token_interval_ms(interval_ms, self.streams, batch_size) / 1000
            if per_token <= 0:
                return
            changed, began = self._changed, loop.time()
            try:
                await asyncio.wait_for(changed.wait(), left * per_token)
            except TimeoutError:
                return
            left -= (loop.time() - began) / per_token
