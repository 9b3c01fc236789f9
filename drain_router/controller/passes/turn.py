"""One turn of a ModelService's daemon: what its recycling pass and its lifecycle pass share."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp

from drain_router.controller import context
from drain_router.controller.kube import workload as workload_


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """The run's context, the workload as read at the start of the turn, the idle probe's HTTP
    client and kopf's logger for the ModelService. The ModelService itself is not here: each pass
    takes it as the previous one stored it and returns it as it stored it."""

    ctx: context.Context
    workload: workload_.Workload
    session: aiohttp.ClientSession
    logger: Any

    def standard_requeue(self) -> float:
        """When a pass that waits (or could not read) looks again: ``requeue_secs`` from now."""
        return self.ctx.clock() + self.ctx.settings.requeue_secs

    def idle_requeue(self) -> float:
        """When a pass with no rules to apply looks again: ``max_sleep_secs`` from now."""
        return self.ctx.clock() + self.ctx.settings.max_sleep_secs
