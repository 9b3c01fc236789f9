"""What the deletion scenarios observe: streams with the wall-clock time they started and ended (to
set them against the audit log's times), every deletion status a ModelService shows on its way out
(watched, so no stage is missed between two polls), and what the gateway routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from drain_router_dev.kube.api import Api, ApiError, Json
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.kube import Kube, path
from e2e.real_engine import REFUSED_PAUSE_SECS, Outcome, Record, sdk_stream

FINALIZER = "drainrouter.dev/staged-deletion"
"""The controller's finalizer on every ModelService it watches."""
SERVICE_LABEL = "drainrouter.dev/service"
"""The label by which an object says which ModelService it belongs to."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stream:
    """One streamed chat completion and when it ran (Unix seconds)."""

    started: float
    ended: float
    record: Record

    @property
    def outcome(self) -> Outcome:
        return self.record.outcome

    def spans(self, moment: float) -> bool:
        """In flight at ``moment``."""
        return self.started < moment < self.ended


@dataclasses.dataclass
class StampedLoad:
    """``clients`` OpenAI SDK clients streaming back to back through ``base_url`` until :meth:`stop`,
    no retries, as :class:`e2e.real_engine.SdkLoad` does; each stream kept with its wall-clock start
    and end, so a scenario can tell the streams in flight at a moment the audit log names."""

    base_url: str
    clients: int
    max_tokens: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    streams: list[Stream] = dataclasses.field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    async def start(self) -> None:
        import openai

        for _ in range(self.clients):
            client = openai.AsyncOpenAI(
                base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=30.0,
                default_headers=self.headers,
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(self._run(client)))

    async def _run(self, client: Any) -> None:
        async with client:
            while not self._stopping:
                started = time.time()
                record = await sdk_stream(client, self.max_tokens)
                self.streams.append(Stream(started, time.time(), record))
                if record.outcome is Outcome.REFUSED:
                    # Load shaping, not synchronisation: a refused user tries again a little later.
                    await asyncio.sleep(REFUSED_PAUSE_SECS)

    async def stop(self, timeout: float = 60.0) -> list[Stream]:
        """Let every client finish the stream it is in; every stream."""
        self._stopping = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), timeout)
        return self.streams

    def count(self, outcome: Outcome, *, since: float = 0.0) -> int:
        return sum(s.outcome is outcome and s.started >= since for s in self.streams)


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """One state of a ModelService's ``status.deletion`` as a watch event carried it."""

    at: float
    deletion: Json
    not_owned: tuple[str, ...]

    @property
    def stage(self) -> str | None:
        return self.deletion.get("stage")

    @property
    def outcome(self) -> str | None:
        return self.deletion.get("outcome")


class DeletionWatch:
    """Watches one ModelService until it is gone, keeping every ``status.deletion`` it shows."""

    def __init__(self, api: Api, namespace: str, name: str) -> None:
        self.api = api
        self.collection = path("ModelService", namespace) + f"?fieldSelector=metadata.name%3D{name}"
        self.seen: list[Seen] = []
        self.gone_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        version = await self._list()
        self._task = asyncio.create_task(self._watch(version))

    async def _list(self) -> str:
        _, listed = await self.api.request("GET", self.collection)
        for item in listed.get("items", []):
            self._record(item)
        if not listed.get("items") and self.seen:
            self.gone_at = self.gone_at or time.time()
        return str(listed["metadata"]["resourceVersion"])

    def _record(self, obj: Json) -> None:
        status = obj.get("status") or {}
        deletion = status.get("deletion") or {}
        if deletion or status.get("notOwned"):
            self.seen.append(Seen(time.time(), deletion, tuple(status.get("notOwned") or ())))

    async def _watch(self, version: str) -> None:
        while self.gone_at is None:
            try:
                async with contextlib.aclosing(self.api.watch(self.collection, version)) as events:
                    async for event in events:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError("WATCH", self.collection, int(obj.get("code", 0)), obj)
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] == "BOOKMARK":
                            continue
                        self._record(obj)
                        if event["type"] == "DELETED":
                            self.gone_at = time.time()
                            return
            except (ApiError, OSError, ValueError):
                version = await self._list()

    def stages(self) -> list[str]:
        """The stages shown, each once, in order."""
        out: list[str] = []
        for seen in self.seen:
            if seen.stage and (not out or out[-1] != seen.stage):
                out.append(seen.stage)
        return out

    @property
    def last(self) -> Seen | None:
        return self.seen[-1] if self.seen else None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def routes(gateway: Gateway, host: str) -> bool:
    """Whether the gateway has a route for ``host`` now (with or without servers)."""
    return any(host.lower() in backend.hosts for backend in gateway.applied)


def drain_complete(root: Path, namespace: str, pod: str) -> Json | None:
    """The ``drain.complete`` line of a pod's router (the node agent keeps each container's log in
    the cluster's state directory after the pod is gone), or ``None`` when it never finished a drain."""
    for log in root.glob(f"pods/{namespace}_{pod}_*/router.log"):
        for line in reversed(log.read_text().splitlines()):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == "drain.complete":
                    return entry
    return None


async def has_finalizer(kube: Kube, namespace: str, name: str) -> bool:
    found = await kube.get("ModelService", namespace, name)
    return found is not None and FINALIZER in (found["metadata"].get("finalizers") or ())


async def release_leftovers(kube: Kube, namespace: str, names: dict[str, list[str]]) -> None:
    """After a scenario, whatever it failed to see removed: each ``kind -> names`` deleted, and a
    ModelService the controller did not release within a minute stripped of its finalizers, so a
    failed scenario does not hold the next one's namespace."""
    for kind, listed in names.items():
        for name in listed:
            await kube.delete(kind, namespace, name)
    for name in names.get("ModelService", []):
        try:
            await kube.wait_gone("ModelService", namespace, name, timeout=60)
        except AssertionError:
            with contextlib.suppress(ApiError):
                await kube.patch("ModelService", namespace, name, {"metadata": {"finalizers": None}})


__all__ = [
    "FINALIZER",
    "SERVICE_LABEL",
    "DeletionWatch",
    "Seen",
    "StampedLoad",
    "Stream",
    "drain_complete",
    "has_finalizer",
    "release_leftovers",
    "routes",
]
