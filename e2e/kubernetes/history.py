"""What the API server held, version by version: watches on a few kinds in one namespace, every
event kept, replayed afterwards in the API server's own order.

The order is the objects' ``resourceVersion``: opaque to clients in general, but on one etcd it is
that store's revision, one counter for every kind, so two objects' versions say which was written
first. Replaying the events in that order gives, at each write, every watched object as the API
server held it then (what a route said while an EndpointSlice had no ready endpoint, say), which
no sequence of polls can.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator

from drain_router_dev.kube.api import Api, ApiError, Json
from e2e.kubernetes.gateway import list_when_ready
from e2e.kubernetes.kube import path


@dataclasses.dataclass(frozen=True)
class Change:
    """One object as a write left it (``deleted``: the write removed it), and when the watch
    delivered it (``time.monotonic``)."""

    version: int
    kind: str
    name: str
    obj: Json
    deleted: bool
    seen: float


@dataclasses.dataclass
class History:
    """Every change of ``kinds`` in ``namespace`` from :meth:`start` to :meth:`stop`, and the state
    each one left."""

    api: Api
    namespace: str
    kinds: tuple[str, ...]
    changes: list[Change] = dataclasses.field(default_factory=list)
    initial: dict[tuple[str, str], Json] = dataclasses.field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    async def start(self) -> None:
        for kind in self.kinds:
            version = await self._list(kind, initial=True)
            self._tasks.append(asyncio.create_task(self._watch(kind, version)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _list(self, kind: str, *, initial: bool) -> str:
        listed = await list_when_ready(self.api, path(kind, self.namespace))
        for item in listed.get("items", []):
            item = {**item, "kind": kind}
            if initial:
                self.initial[(kind, item["metadata"]["name"])] = item
            else:  # a watch broken and listed again: what it shows counts as a change
                self._record(kind, item, deleted=False)
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, kind: str, version: str) -> None:
        while True:
            try:
                async with contextlib.aclosing(self.api.watch(path(kind, self.namespace), version)) as events:
                    async for event in events:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError("WATCH", kind, int(obj.get("code", 0)), obj)
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._record(kind, obj, deleted=event["type"] == "DELETED")
            except (ApiError, OSError, ValueError):
                with contextlib.suppress(ApiError, OSError):
                    version = await self._list(kind, initial=False)

    def _record(self, kind: str, obj: Json, *, deleted: bool) -> None:
        meta = obj["metadata"]
        self.changes.append(Change(int(meta["resourceVersion"]), kind, meta["name"], obj, deleted, time.monotonic()))

    def states(self) -> Iterator[tuple[Change, dict[tuple[str, str], Json]]]:
        """Each change in the API server's order, with every watched object as it left them."""
        held = dict(self.initial)
        seen: set[tuple[int, str, str]] = set()
        for change in sorted(self.changes, key=lambda c: c.version):
            key = (change.version, change.kind, change.name)
            if key in seen:  # a relist repeats what a watch already gave
                continue
            seen.add(key)
            if change.deleted:
                held.pop((change.kind, change.name), None)
            else:
                held[(change.kind, change.name)] = change.obj
            yield change, held

    def versions(self, kind: str, name: str) -> list[Json]:
        """The successive versions of one object, in order (its deletion left out)."""
        found = [self.initial[(kind, name)]] if (kind, name) in self.initial else []
        for change, held in self.states():
            if (change.kind, change.name) == (kind, name) and not change.deleted:
                found.append(held[(kind, name)])
        return found


__all__ = ["Change", "History"]
