"""The API server's audit log, read back: who sent which call on which object, and when.

The control plane logs every request at the ``Metadata`` level (user, verb, object, answer; no
bodies) as JSON lines. A scenario marks the log before it acts (:class:`AuditLog` remembers the
size) and reads the calls answered since: the one place that shows what the controller *sent*, not
only what the objects look like afterwards.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

#: The verbs that change an object.
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclasses.dataclass(frozen=True)
class Call:
    """One answered request (its ``ResponseComplete`` entry)."""

    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    received: float
    """Unix seconds the API server received it."""
    answered: float
    """Unix seconds it answered."""

    @property
    def write(self) -> bool:
        return self.verb in WRITES

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f"{self.user} {self.verb} {what} {self.namespace}/{self.name} -> {self.code}"


def seconds(stamp: str) -> float:
    """An RFC 3339 time -> Unix seconds."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def parse(line: str) -> Call | None:
    """A ``ResponseComplete`` entry about an object -> its call; anything else -> ``None``."""
    entry = json.loads(line)
    ref = entry.get("objectRef")
    if entry.get("stage") != "ResponseComplete" or not ref:
        return None
    return Call(
        user=entry["user"]["username"],
        verb=entry["verb"],
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=int((entry.get("responseStatus") or {}).get("code", 0)),
        received=seconds(entry["requestReceivedTimestamp"]),
        answered=seconds(entry["stageTimestamp"]),
    )


@dataclasses.dataclass
class AuditLog:
    """The calls answered since this mark (the log's size when it was made)."""

    path: Path
    offset: int = -1

    def __post_init__(self) -> None:
        if self.offset < 0:
            self.offset = self.path.stat().st_size

    def calls(self) -> list[Call]:
        """Every call answered since the mark, in the log's order; a line still being written is
        left for the next read."""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        return [call for line in complete.decode().splitlines() if (call := parse(line)) is not None]

    def writes(self, user: str, namespace: str | None = None) -> list[Call]:
        """The writes ``user`` sent since the mark (in ``namespace`` when given)."""
        return [
            c for c in self.calls() if c.write and c.user == user and (namespace is None or c.namespace == namespace)
        ]


def service_account(namespace: str, name: str) -> str:
    """The user name a service account's token authenticates as."""
    return f"system:serviceaccount:{namespace}:{name}"


__all__ = ["WRITES", "AuditLog", "Call", "parse", "seconds", "service_account"]
