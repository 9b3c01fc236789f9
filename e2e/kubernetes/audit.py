"""The API server's audit log, read back: who sent which call on which object, from which pod, when,
and what the server answered.

The control plane logs every request at the ``Metadata`` level (user, verb, object, answer; no
bodies) as JSON lines, one line per stage of each request. A scenario marks the log before it acts
(:class:`AuditLog` remembers the size; ``whole=True`` reads from the start) and reads the calls
answered since: the one place that shows what the controller *sent*, not only what the objects look
like afterwards. Times are the API server's clock, the machine's wall clock: the same clock the
pods' logs use.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from drain_router.decisions import durations

#: The verbs that change an object.
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
POD_NAME = "authentication.kubernetes.io/pod-name"
DECISION = "authorization.k8s.io/decision"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request, as its last stage recorded it: ``ResponseComplete``, or ``ResponseStarted`` for a
    watch still open."""

    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    """0 when the stage recorded none."""
    received: float
    """Unix seconds the API server received it."""
    answered: float
    """Unix seconds of the stage: when it answered (a watch still open: when it started answering)."""
    pod: str = ""
    """The pod whose bound service-account token sent it; empty for any other credential."""
    cause: str = ""
    """The first cause's reason of a refusal (``DisruptionBudget`` for a budget's 429), else its reason."""
    group: str = ""
    decision: str = ""
    """The authorizer's decision: ``allow``, ``forbid``, or empty."""
    source: str = ""
    """The client's address."""
    uri: str = ""

    @property
    def write(self) -> bool:
        return self.verb in WRITES

    @property
    def rule_resource(self) -> str:
        """The resource as an RBAC rule names it: ``pods/eviction``."""
        return self.resource + (f"/{self.subresource}" if self.subresource else "")

    def __str__(self) -> str:
        return f"{self.user} {self.verb} {self.rule_resource} {self.namespace}/{self.name} -> {self.code}"


def ok(code: int) -> bool:
    return 200 <= code < 300


def service_account(namespace: str, name: str) -> str:
    """The user name a service account's token authenticates as."""
    return f"system:serviceaccount:{namespace}:{name}"


def parse(entry: dict[str, Any]) -> Call:
    """One audit entry -> its call."""
    ref = entry.get("objectRef") or {}
    user = entry.get("user") or {}
    status = entry.get("responseStatus") or {}
    causes = (status.get("details") or {}).get("causes") or [{}]
    return Call(
        user=user.get("username", ""),
        verb=entry["verb"],
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=int(status.get("code", 0)),
        received=durations.parse_time(entry["requestReceivedTimestamp"]),
        answered=durations.parse_time(entry["stageTimestamp"]),
        pod=((user.get("extra") or {}).get(POD_NAME) or [""])[0],
        cause=causes[0].get("reason") or status.get("reason", ""),
        group=ref.get("apiGroup", ""),
        decision=(entry.get("annotations") or {}).get(DECISION, ""),
        source=(entry.get("sourceIPs") or [""])[0],
        uri=entry.get("requestURI", ""),
    )


class AuditLog:
    """The log read as it grows, from a mark (its size when this was made, or its start with
    ``whole``): each read parses only the complete lines written since the last one."""

    def __init__(self, path: Path, *, whole: bool = False) -> None:
        self.path = path
        self._offset = 0 if whole else path.stat().st_size
        self._answered: list[Call] = []
        self._open: dict[str, Call] = {}

    def _read(self) -> None:
        with self.path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            entry = json.loads(line)
            if entry["stage"] == "ResponseComplete":
                self._open.pop(entry["auditID"], None)
                self._answered.append(parse(entry))
            elif entry["stage"] == "ResponseStarted":
                self._open[entry["auditID"]] = parse(entry)

    def calls(self) -> list[Call]:
        """Every request answered since the mark, in the log's order."""
        self._read()
        return list(self._answered)

    def requests(self) -> list[Call]:
        """:meth:`calls`, and the watches still open (started answering, not yet complete)."""
        self._read()
        return [*self._answered, *self._open.values()]

    def by(self, user: str, namespace: str | None = None) -> list[Call]:
        """The calls ``user`` sent since the mark (in ``namespace`` when given)."""
        return [c for c in self.calls() if c.user == user and (namespace is None or c.namespace == namespace)]

    def writes(self, user: str, namespace: str | None = None) -> list[Call]:
        """The writes ``user`` sent since the mark (in ``namespace`` when given)."""
        return [c for c in self.by(user, namespace) if c.write]

    def evictions(self, user: str, namespace: str) -> list[Call]:
        """``user``'s ``create pods/eviction`` in ``namespace``, whatever the answer, in order."""
        found = [c for c in self.by(user, namespace) if c.subresource == "eviction" and c.verb == "create"]
        return sorted(found, key=lambda c: c.received)


__all__ = ["WRITES", "AuditLog", "Call", "ok", "parse", "service_account"]
