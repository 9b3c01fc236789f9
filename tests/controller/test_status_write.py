"""Status writes carry ``metadata.resourceVersion`` (the recycling/lifecycle daemon's and the staged
deletion's); a 409 re-reads the ModelService, rebuilds the patch from what is stored now and retries
once."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from kopf._core.engines import posting
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from drain_router.controller import context, crd, metrics, settings, status
from drain_router.controller.kube import client as kube_
from drain_router.controller.passes import deleting
from drain_router.decisions import deletion

from .conftest import MSVC, NAMESPACE


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

    def info(self, message: str) -> None:
        pass


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


class RacingKube(kube_.Kube):
    """The first pod list of a pass lets another writer's status patch land first (the daemon's
    ``RecycleHeld`` condition), as it can while the deletion pass observes."""

    def __init__(self, api: Any, server: Any) -> None:
        super().__init__(api)
        self.server, self.raced = server, False

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        if not self.raced:
            self.raced = True
            held = {"type": "RecycleHeld", "status": "True", "reason": "Busy", "message": "pod a is busy"}
            response = await self.server.client.patch(
                f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}/llama/status",
                json={"status": {"conditions": [held]}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert response.status == 200, await response.text()
        return await super().list_pods(namespace, label_selector)


async def test_the_deletion_pass_keeps_a_condition_written_while_it_observed(cluster: Any) -> None:
    """1. a ModelService being deleted 2. its deletion pass reads it, then observes 3. meanwhile the
    daemon writes its RecycleHeld condition 4. the pass writes its status. Result: both conditions
    are stored (the pass's write carried the resourceVersion it read, got 409, re-read, rebuilt), and
    the stage the pass decided is recorded; an unconditional merge patch of ``conditions`` lost it."""
    emu, server = cluster
    await emu.put(
        MSVC,
        {
            "apiVersion": f"{crd.group()}/{crd.version()}",
            "kind": "ModelService",
            "metadata": {"name": "llama", "namespace": NAMESPACE, "finalizers": ["test/hold"]},
            "spec": {"podSelector": {"matchLabels": {"app": "llama"}}, "workload": [], "route": None},
        },
    )
    response = await server.client.delete(f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}/llama")
    assert response.status == 200
    fresh = emu.get(MSVC, NAMESPACE, "llama")
    assert fresh is not None and fresh["metadata"].get("deletionTimestamp")
    posting.event_queue_var.set(asyncio.Queue())  # kopf.event() outside a running operator
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.settings_var.set(kopf.OperatorSettings())
    configuration = client.Configuration(host=str(server.url).rstrip("/"))
    async with client.ApiClient(configuration) as api:
        ctx = context.Context(
            settings=settings.ControllerSettings(namespaces=(NAMESPACE,), read_nodes=False),
            kube=RacingKube(api, server),
            metrics=metrics.ControllerMetrics(CollectorRegistry()),
        )
        decision = await deleting.deletion_step(ctx, fresh, Log())
    assert decision.status is not None and decision.status.stage is not None
    stored = emu.get(MSVC, NAMESPACE, "llama")
    assert stored is not None
    types = [c["type"] for c in stored["status"].get("conditions") or ()]
    assert "RecycleHeld" in types and len(types) == 2, types
    assert stored["status"]["deletion"]["stage"] == decision.status.stage.value
