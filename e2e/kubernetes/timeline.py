"""Every change of one collection, in the order the API server made them: a list, then a watch from the
list's ``resourceVersion``.

A watch delivers the events of one collection in the order they were written, so the state replayed up
to any event is the state the API server held at that write: "which pods were Ready when this one
was evicted" is read from the history, never guessed from two clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator

import aiohttp

from drain_router_dev.kube.api import Api, ApiError, Json


@dataclasses.dataclass(frozen=True)
class Change:
    """One event: ``ADDED``, ``MODIFIED`` or ``DELETED``; the object as written; when this process saw it."""

    type: str
    obj: Json
    seen: float

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


class History:
    """A collection's changes since :meth:`start` (its objects then, as ``ADDED``)."""

    def __init__(self, api: Api, path: str) -> None:
        self.api = api
        self.path = path
        self.changes: list[Change] = []
        self.resyncs = 0
        """Times the watch broke and the history went on from a fresh list (the order across a
        resync is the list's, not each write's)."""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        version = await self._list()
        self._task = asyncio.create_task(self._watch(version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def current(self) -> dict[str, Json]:
        """The objects as of the last change seen."""
        state: dict[str, Json] = {}
        for change in list(self.changes):
            if change.type == "DELETED":
                state.pop(change.name, None)
            else:
                state[change.name] = change.obj
        return state

    def replay(self) -> Iterator[tuple[Change, dict[str, Json]]]:
        """Each change with the state just before it (name -> object)."""
        state: dict[str, Json] = {}
        for change in list(self.changes):
            yield change, dict(state)
            if change.type == "DELETED":
                state.pop(change.name, None)
            else:
                state[change.name] = change.obj

    async def _list(self) -> str:
        _, listed = await self.api.request("GET", self.path)
        seen = time.time()
        known = self.current()
        items = {item["metadata"]["name"]: item for item in listed.get("items", [])}
        for name, obj in known.items():
            if name not in items:
                self.changes.append(Change("DELETED", obj, seen))
        for name, item in items.items():
            if known.get(name) != item:
                self.changes.append(Change("ADDED" if name not in known else "MODIFIED", item, seen))
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> None:
        while True:
            try:
                # Closed at once whatever ends the loop (an ERROR event, a cancel): an async generator
                # left to the garbage collector keeps its connection open until then.
                async with contextlib.aclosing(self.api.watch(self.path, version)) as events:
                    async for event in events:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError("WATCH", self.path, int(obj.get("code", 0)), obj)
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.changes.append(Change(event["type"], obj, time.time()))
            except (ApiError, aiohttp.ClientError, OSError, ValueError, TimeoutError):
                self.resyncs += 1
                version = await self._list()


__all__ = ["Change", "History"]
