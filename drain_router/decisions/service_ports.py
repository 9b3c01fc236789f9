"""The activator's ports: one per sleeping service and protocol, assigned by the controller and read
by the activator. Purely computational, no side effects.

While a ModelService sleeps, its Service gets the activator's pods as endpoints, on a port the
activator opens for that service alone: the port a connection arrives on, never anything the client
sends, says which service it is for. The record of which port is whose is one ConfigMap in the
activator's namespace (:func:`configmap_name`), written only by the controller and read by the
activator; its ``data`` maps a port, in decimal, to ``<namespace>/<name>/<protocol>``
(:class:`Assignment`): ``http`` for HTTP/1.1 and WebSocket, ``grpc`` for h2c.

A service keeps its ports for as long as its ModelService exists (:func:`assign` never moves one):
a client that still has the old endpoints, or a connection opened just before the wake, can only
ever reach the service it was meant for. Ports are released (:func:`release`) only when the
ModelService is gone. An entry that does not parse is dropped (:func:`parse`), so a hand-edited map
can refuse connections but never send one to a service that was not named.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

HTTP = "http"
GRPC = "grpc"
PROTOCOLS = (HTTP, GRPC)

DEFAULT_PORTS = range(20000, 21000)
"""The ports the controller assigns from (``--activator-ports``): a thousand sleeping services, each
with an HTTP and a gRPC port at most, fit with room to spare."""
CONFIGMAP_SUFFIX = "-ports"

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_ENTRY = re.compile(rf"(?P<namespace>{_LABEL})/(?P<name>{_LABEL}(?:\.{_LABEL})*)/(?P<protocol>http|grpc)")
_RANGE = re.compile(r"(?P<first>[0-9]{1,5})-(?P<last>[0-9]{1,5})")
MAX_NAME_LENGTH = 253


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Assignment:
    """Whose a port is: a ModelService and the protocol its clients speak there."""

    namespace: str
    name: str
    protocol: str

    @property
    def service(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}/{self.protocol}"


def configmap_name(activator_service: str) -> str:
    """The port map's ConfigMap, named after the activator's Service."""
    return f"{activator_service}{CONFIGMAP_SUFFIX}"


def parse_entry(text: Any) -> Assignment | None:
    """An entry's value, or None when it names no valid service and protocol."""
    if not isinstance(text, str):
        return None
    match = _ENTRY.fullmatch(text)
    if match is None or len(match["name"]) > MAX_NAME_LENGTH:
        return None
    return Assignment(match["namespace"], match["name"], match["protocol"])


def parse_port(text: Any, ports: range | None = None) -> int | None:
    """A key: a port in decimal (within ``ports`` when given), or None."""
    if not isinstance(text, str) or not text.isdigit() or len(text) > 5 or text != str(int(text)):
        return None
    port = int(text)
    if not 0 < port < 65536 or (ports is not None and port not in ports):
        return None
    return port


def parse(data: Mapping[str, Any] | None, ports: range | None = None) -> dict[int, Assignment]:
    """The map a ConfigMap's ``data`` holds. A malformed key or value is dropped; an assignment that
    appears under two ports keeps only the lower port (one service, one port per protocol), so a
    reader and the writer agree on every port they both keep."""
    table: dict[int, Assignment] = {}
    seen: set[Assignment] = set()
    for key, value in sorted((data or {}).items(), key=lambda kv: parse_port(kv[0]) or 0):
        port, assignment = parse_port(key, ports), parse_entry(value)
        if port is None or assignment is None or assignment in seen:
            continue
        table[port] = assignment
        seen.add(assignment)
    return table


def render(table: Mapping[int, Assignment]) -> dict[str, str]:
    """The ConfigMap's ``data`` for ``table``, in port order."""
    return {str(port): str(table[port]) for port in sorted(table)}


def port_of(table: Mapping[int, Assignment], assignment: Assignment) -> int | None:
    for port, held in table.items():
        if held == assignment:
            return port
    return None


def assign(
    table: Mapping[int, Assignment], wanted: Iterable[Assignment], ports: range
) -> tuple[dict[int, Assignment], tuple[Assignment, ...]]:
    """``table`` with a port for each of ``wanted`` that has none: the lowest free one in ``ports``.
    Existing entries never move (even outside ``ports``, after the range was changed). Returns the
    new table and the assignments that found no free port, in order."""
    new = dict(table)
    taken = set(new)
    held = set(new.values())
    free = (port for port in ports if port not in taken)
    left: list[Assignment] = []
    for assignment in sorted(set(wanted)):
        if assignment in held:
            continue
        port = next(free, None)
        if port is None:
            left.append(assignment)
            continue
        new[port] = assignment
        held.add(assignment)
    return new, tuple(left)


def release(table: Mapping[int, Assignment], keep: Callable[[Assignment], bool]) -> dict[int, Assignment]:
    """``table`` without the entries ``keep`` says no to (their ModelService is gone)."""
    return {port: a for port, a in table.items() if keep(a)}


def parse_range(text: str) -> range:
    """``FIRST-LAST`` (inclusive, 1..65535, FIRST <= LAST); ``ValueError`` saying what is wrong."""
    match = _RANGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r}: expected FIRST-LAST, two port numbers")
    first, last = int(match["first"]), int(match["last"])
    if not 0 < first <= last < 65536:
        raise ValueError(f"{text!r}: ports must be 1..65535 with FIRST <= LAST")
    return range(first, last + 1)
