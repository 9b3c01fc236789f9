"""How the real kopf logs the staged deletion's handler: a requeue is the normal way a deletion waits
and is logged at DEBUG; a handler that fails is logged at ERROR, as kopf does."""

from __future__ import annotations

import logging

import kmock
import pytest

from .conftest import MSVC, ClusterEmulator, Operator, eventually
from .scenario import delete_msvc, make_service, msvc


def _kopf_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kopf.objects" and r.levelno == level]


async def test_a_requeue_is_logged_at_debug_never_at_error(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """1. Pods ignore SIGTERM, grace 2 s. 2. Deleted: the pass requeues while they terminate.
    Result: every requeue is logged at DEBUG (with its message), none at ERROR."""
    caplog.set_level(logging.DEBUG, logger="kopf.objects")
    emu, server = cluster
    await make_service(emu, grace=2, exits_after=None, deletion_spec={"routeSettle": "0s"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release after the pods' grace")
    requeues = [m for m in _kopf_records(caplog, logging.DEBUG) if "requeue: waiting for 2 pods" in m]
    assert requeues, "no requeue logged at DEBUG"
    assert _kopf_records(caplog, logging.ERROR) == []


async def test_a_failing_pass_is_logged_at_error(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """1. Reading the ModelService answers 500. 2. Deleted. Result: kopf logs the handler's failure
    at ERROR (the filter demotes only requeues)."""
    caplog.set_level(logging.INFO, logger="kopf.objects")
    emu, server = cluster
    await make_service(emu)
    emu.fail("fetch", MSVC, "llama", 500, "InternalError", "etcdserver: request timed out")
    await delete_msvc(emu, server)
    await eventually(
        lambda: any("request timed out" in m for m in _kopf_records(caplog, logging.ERROR)),
        what="the failure logged at ERROR",
    )
