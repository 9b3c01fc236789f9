"""What the front decides about a service's pods and a request's answers, with no I/O: which pod a
request goes to, which answers are worth a retry on another pod, how a pod's router says it is
leaving, where an event stream's events end, the head of a request sent again, and which pods the
API server lists. The front (:mod:`drain_router.front`) reads and writes, and asks here; a cut
stream's continuation is :mod:`.continuation`'s.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drain_router.decisions.stream_ends import CutMark, cut_mark
from drain_router.decisions.wake_endpoints import MANAGED_BY_LABEL, SERVICE_NAME_LABEL

REFUSED_HEADER = b"x-drain-router-refused"
"""The header a pod's router puts on an answer of its own to a request the model server never saw."""

TOO_MANY_REQUESTS = 429

MAX_EVENT_BYTES = 1 << 20
"""The largest event-stream event the front follows (1 MiB): an event is held until its end arrives,
to be judged whole, so this bounds what one stream holds. A bigger one ends the following: the rest
of the stream is relayed as it comes, and is not continued if cut."""


MAX_FOLLOWED_BYTES = 16 << 20
"""The most event bytes of one response the front follows (16 MiB: about 80,000 tokens of OpenAI
chunks at some 200 bytes each). Past it the rest is relayed as it comes and the stream is no longer
continued, so what a tracked stream keeps of its answer (its text, a few bytes a token, and in the
token-ids dialect 8 bytes a token) is bounded too."""


def refusal_mark(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The pod's router's refusal mark (its reason), whatever the status; None: not marked."""
    for name, value in headers:
        if len(name) == len(REFUSED_HEADER) and name.lower() == REFUSED_HEADER:
            return value.decode("latin-1").strip() or "refused"
    return None


def retry_reason(status: int, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The reason to send a request again to another pod: the router's refusal mark (the model server
    never saw the request), except on a 429. A 429 means the pod is full (its queue, or the model
    server's own limit): a retry would multiply the overload it reports, so the client gets it."""
    if status == TOO_MANY_REQUESTS:
        return None
    return refusal_mark(headers)


def closes(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The pod's router said ``Connection: close``: it is draining (or shedding connections), so the
    front sends it nothing new from this answer on, before its endpoints catch up."""
    for name, value in headers:
        if len(name) == 10 and name.lower() == b"connection" and b"close" in value.lower():
            return True
    return False


def least_loaded(loads: Sequence[int | None], turn: int) -> int | None:
    """The index of the pod to send to: the fewest requests in flight among the candidates (``None``:
    not a candidate), ties broken in turn from ``turn`` (so equal pods share the load rather than the
    first taking everything); None when no pod is a candidate."""
    count = len(loads)
    best: int | None = None
    best_load = 0
    for step in range(count):
        index = (turn + step) % count
        load = loads[index]
        if load is not None and (best is None or load < best_load):
            best, best_load = index, load
    return best


class EventSplitter:
    """An event stream cut into whole events, as they arrive: each event's bytes with the blank line
    that ends it (LF or CRLF line ends). What is left of an event not yet ended is kept, at most
    :data:`MAX_EVENT_BYTES`; past it, :attr:`overflow` is set and the kept bytes are handed back by
    :meth:`take_rest`."""

    __slots__ = ("overflow", "rest")

    def __init__(self) -> None:
        self.rest = b""
        self.overflow = False

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self.rest + data if self.rest else data
        events: list[bytes] = []
        start = 0
        # The next end of each kind, each searched again only once passed: one scan of the read
        # (a CRLF search that finds nothing is not repeated for every LF event).
        lf = buffer.find(b"\n\n")
        crlf = buffer.find(b"\n\r\n")
        while lf >= 0 or crlf >= 0:
            end = crlf + 3 if crlf >= 0 and (lf < 0 or crlf < lf) else lf + 2
            events.append(buffer[start:end])
            start = end
            if 0 <= lf < start:
                lf = buffer.find(b"\n\n", start)
            if 0 <= crlf < start:
                crlf = buffer.find(b"\n\r\n", start)
        self.rest = buffer[start:]
        if len(self.rest) > MAX_EVENT_BYTES:
            self.overflow = True
        return events

    def take_rest(self) -> bytes:
        rest, self.rest = self.rest, b""
        return rest


def cut_mark_of(data: bytes) -> CutMark | None:
    """The router's cut mark, when an event's data is its error event (checked cheaply first)."""
    if b"error" not in data:
        return None
    try:
        return cut_mark(json.loads(data))
    except (ValueError, RecursionError):
        return None


def event_data(event: bytes) -> bytes | None:
    """The data of one whole event (its ``data`` lines joined by LF, as an SSE client reads it); None
    for an event with no data (a comment, a keep-alive)."""
    if event.startswith(b"data: ") and event.count(b"\n") == 2 and event.endswith(b"\n\n"):
        return event[6:-2]  # the common shape: one data line
    lines = event.replace(b"\r\n", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


_DROPPED = (b"content-length", b"transfer-encoding", b"expect")


def resend_head(head: bytes, target: bytes, length: int) -> bytes:
    """The head of a request sent again with another body (a continuation): ``target`` in its request
    line, and ``Content-Length: length`` in place of the original's length, chunked coding or
    ``Expect`` (the body goes whole with the head); every other header as the original sent it."""
    lines = head.split(b"\r\n")
    method = lines[0].split(b" ", 1)[0]
    kept = [line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in _DROPPED]
    return b"\r\n".join([method + b" " + target + b" HTTP/1.1", *kept, b"content-length: %d" % length, b"", b""])


# -- the pods of a service, from the API server ---------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """A pod's router as an EndpointSlice lists it."""

    address: str
    ready: bool

    def url(self, port: int) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{port}"


def service_names(modelservice: Mapping[str, Any]) -> list[str]:
    """The Services of a ModelService: the core ``Service`` entries of its ``spec.workload``, else a
    Service named as the ModelService."""
    spec = modelservice.get("spec")
    workload = spec.get("workload") if isinstance(spec, dict) else None
    names = [
        str(item["name"])
        for item in (workload if isinstance(workload, list) else [])
        if isinstance(item, dict)
        and item.get("kind") == "Service"
        and item.get("apiVersion") == "v1"
        and isinstance(item.get("name"), str)
    ]
    if names:
        return names
    name = (modelservice.get("metadata") or {}).get("name")
    return [name] if isinstance(name, str) else []


def endpoints(slices: Iterable[Mapping[str, Any]], services: Sequence[str]) -> list[Endpoint]:
    """The pods in the Services' EndpointSlices, each address once: the activator's slices are left
    out (an endpoint of a sleeping service, not one of its pods), and so are endpoints terminating.
    Ready is the slice's ``conditions.ready`` (absent: ready, as the API defines it)."""
    found: dict[str, Endpoint] = {}
    for item in slices:
        labels = (item.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == "drain-router.dev" or labels.get(SERVICE_NAME_LABEL) not in services:
            continue
        for endpoint in item.get("endpoints") or ():
            if not isinstance(endpoint, dict):
                continue
            conditions = endpoint.get("conditions") or {}
            if conditions.get("terminating") is True:
                continue
            ready = conditions.get("ready") is not False
            for address in endpoint.get("addresses") or ():
                if _address(address) and (address not in found or ready):
                    found[address] = Endpoint(address, ready)
    return sorted(found.values(), key=lambda e: e.address)


def _address(text: Any) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
