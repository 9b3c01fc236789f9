"""Status writes of the recycling/lifecycle daemon carry ``metadata.resourceVersion``; a 409 re-reads
the ModelService, rebuilds the patch from what is stored now and retries once."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from router.controller import context, metrics, settings, status
from router.controller import kube as kube_
from router.decisions import deletion


class FakeKube:
    """Answers the status patch with 409 ``conflicts`` times, then stores it."""

    def __init__(self, conflicts: int) -> None:
        self.conflicts = conflicts
        self.stored: dict[str, Any] = {
            "metadata": {"namespace": "ns", "name": "llama", "resourceVersion": "7"},
            "status": {"conditions": [{"type": "Other", "status": "True"}]},
        }
        self.patches: list[tuple[dict[str, Any], str | None]] = []

    async def patch_modelservice_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> dict[str, Any]:
        self.patches.append((status, resource_version))
        if self.conflicts:
            self.conflicts -= 1
            self.stored["metadata"]["resourceVersion"] = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
            raise kube_.Conflict(deletion.ApiFailure(call="PATCH", code=409, message="modified"))
        self.stored = {**self.stored, "status": {**self.stored["status"], **status}}
        return self.stored

    async def get_modelservice(self, namespace: str, name: str) -> dict[str, Any]:
        return self.stored


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str) -> None:
        self.warnings.append(message)


def _ctx(fake: FakeKube) -> context.Context:
    return context.Context(
        settings=settings.ControllerSettings(namespaces=("ns",)),
        kube=fake,  # type: ignore[arg-type]
        metrics=metrics.ControllerMetrics(CollectorRegistry()),
    )


def _build(current: Any) -> dict[str, Any]:
    return {
        "lifecycle": {"idleSince": "2026-01-01T00:00:00Z"},
        "conditions": [*current.get("conditions", []), {"type": "LifecycleRulesValid", "status": "True"}],
    }


async def test_a_conflict_is_re_read_and_retried_once() -> None:
    fake = FakeKube(conflicts=1)
    stale = {"metadata": {"namespace": "ns", "name": "llama", "resourceVersion": "6"}, "status": {}}
    fresh, written = await status.write_status(_ctx(fake), stale, _build, Log())
    assert written and fresh is fake.stored
    assert [rv for _, rv in fake.patches] == ["6", "8"]
    # rebuilt from the re-read status: the condition written there is kept
    assert [c["type"] for c in fake.patches[1][0]["conditions"]] == ["Other", "LifecycleRulesValid"]


async def test_two_conflicts_give_up_for_this_pass() -> None:
    fake, log = FakeKube(conflicts=2), Log()
    _, written = await status.write_status(_ctx(fake), fake.stored, _build, log)
    assert not written and len(fake.patches) == 2 and log.warnings


async def test_nothing_to_write_sends_nothing() -> None:
    fake = FakeKube(conflicts=0)
    _, written = await status.write_status(_ctx(fake), fake.stored, lambda _: None, Log())
    assert written and not fake.patches
