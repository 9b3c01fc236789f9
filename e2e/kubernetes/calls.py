"""The API server's audit log as the scenarios read it: every request that got an answer, who sent it
(for a service account's bound token, from which pod) and what the server answered.

The control plane writes it at the ``Metadata`` level in JSON lines (one line per stage of each
request); only ``ResponseComplete`` lines are kept. Times are the API server's clock, the machine's
wall clock: the same clock the pods' logs use.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

#: The controller chart's service account, as the session installs it.
CONTROLLER_USER = "system:serviceaccount:drain-router-system:ctl-drain-router-controller"
POD_NAME = "authentication.kubernetes.io/pod-name"


def epoch(stamp: str) -> float:
    """An RFC 3339 time (``2026-12-06T13:44:40.021688Z``, the audit log's and a Lease's) as Unix seconds."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclasses.dataclass(frozen=True)
class Call:
    """One answered request."""

    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    user: str
    pod: str
    """The pod whose bound service-account token sent it; empty for any other credential."""
    received: float
    completed: float
    cause: str = ""
    """The first cause's reason of a refusal (``DisruptionBudget`` for a budget's 429), else its reason."""

    def __str__(self) -> str:
        when = datetime.datetime.fromtimestamp(self.received, datetime.UTC).strftime("%H:%M:%S.%f")
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        answer = f"{self.code} {self.cause}".rstrip()
        return f"{when} {self.pod or self.user} {self.verb} {what} {self.namespace}/{self.name} -> {answer}"


def call(entry: dict[str, Any]) -> Call:
    ref = entry.get("objectRef") or {}
    user = entry.get("user") or {}
    pods = (user.get("extra") or {}).get(POD_NAME) or [""]
    status = entry.get("responseStatus") or {}
    causes = (status.get("details") or {}).get("causes") or [{}]
    return Call(
        verb=entry["verb"],
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=int(status.get("code", 0)),
        user=user.get("username", ""),
        pod=pods[0],
        received=epoch(entry["requestReceivedTimestamp"]),
        completed=epoch(entry["stageTimestamp"]),
        cause=causes[0].get("reason") or status.get("reason", ""),
    )


class AuditLog:
    """The log read as it grows: :meth:`calls` parses the complete lines written since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._calls: list[Call] = []

    def calls(self) -> list[Call]:
        with self.path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            entry = json.loads(line)
            if entry.get("stage") == "ResponseComplete":
                self._calls.append(call(entry))
        return list(self._calls)

    def controller(self, *, namespace: str | None = None) -> list[Call]:
        """The controller's requests (either replica), in ``namespace`` when given."""
        return [
            c for c in self.calls() if c.user == CONTROLLER_USER and (namespace is None or c.namespace == namespace)
        ]

    def evictions(self, namespace: str) -> list[Call]:
        """The controller's ``create pods/eviction`` in ``namespace``, whatever the answer, in order."""
        found = [c for c in self.controller(namespace=namespace) if c.subresource == "eviction" and c.verb == "create"]
        return sorted(found, key=lambda c: c.received)


def ok(code: int) -> bool:
    return 200 <= code < 300


__all__ = ["CONTROLLER_USER", "AuditLog", "Call", "epoch", "ok"]
