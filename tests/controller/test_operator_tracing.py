"""The controller's passes as spans (``--tracing``): the real operator against the emulated API
server, the real SDK and exporter, a real OTLP/HTTP receiver. Each recycling and lifecycle pass, and
each pass of the staged deletion, is an INTERNAL span naming its ModelService."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.decisions import spans
from tests import otlp

from . import fake_routers
from .conftest import NAMESPACE
from .rules_scenario import make_service
from .scenario import delete_msvc, msvc

INTERNAL = 1  # Span.SpanKind.SPAN_KIND_INTERNAL


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[otlp.Receiver]:
    async with otlp.running() as r:
        for key, value in otlp.environment(r.endpoint, OTEL_SERVICE_NAME="controller-under-test").items():
            if key.startswith("OTEL_"):
                monkeypatch.setenv(key, value)
        yield r


async def test_passes_are_spans_naming_the_modelservice(
    cluster: Any, start_operator: Any, receiver: otlp.Receiver
) -> None:
    """1. a ModelService with recycling 2. the operator runs with tracing 3. it is deleted.
    Result: recycle and lifecycle pass spans, then deletion pass spans with the stage they left it
    in, each naming the ModelService by namespace, name and uid."""
    emu, server = cluster
    async with fake_routers.running() as routers:
        await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 3600})
        await start_operator(tracing=True, max_sleep_secs=0.5)
        obj = msvc(emu)
        assert obj is not None
        uid = obj["metadata"]["uid"]
        named = {"k8s.namespace.name": NAMESPACE, "drain_router.modelservice.name": "llama"}
        await receiver.wait_spans(1, **named, **{"drain_router.modelservice.uid": uid})
        await delete_msvc(emu, server)
        await receiver.wait_spans(1, **named, **{"drain_router.deletion.verdict": "Release"})
    names = {s.name for s in receiver.spans}
    assert {spans.RECYCLE_PASS, spans.LIFECYCLE_PASS, spans.DELETION_PASS} <= names
    for s in receiver.spans:
        assert s.kind == INTERNAL
        assert s.attributes["drain_router.modelservice.uid"] == uid
        assert s.resource["service.name"] == "controller-under-test"
    stages = [s.attributes.get("drain_router.deletion.stage") for s in receiver.spans if s.name == spans.DELETION_PASS]
    assert stages and all(stages)
