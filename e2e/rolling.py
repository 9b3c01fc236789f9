"""A rolling restart as Kubernetes does one, driven by hand: each replica in turn gets SIGTERM, is
waited for until it exits, is started again on the same ports, and is waited for until the balancer
has it UP again."""

from __future__ import annotations

import time
from typing import Any

import aiohttp


async def restart_in_turn(
    replicas: list[Any], balancer: Any, session: aiohttp.ClientSession, cycles: int
) -> tuple[list[int], list[float]]:
    """``cycles`` rounds over ``replicas``; returns each exit status and the monotonic time of each
    SIGTERM, in order."""
    exit_codes: list[int] = []
    sigterms: list[float] = []
    for _cycle in range(cycles):
        for replica in replicas:
            sigterms.append(time.monotonic())
            replica.sigterm()
            exit_codes.append(await replica.process.wait_exit(timeout=20))
            await replica.start(session)
            await balancer.wait_status(replica.name, "UP")
    return exit_codes, sigterms
