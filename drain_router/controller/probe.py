"""The idle probe: ``GET http://<podIP>:<adminPort>/admin/inflight`` on one pod's router.

It fails closed: no podIP, a connection error, a timeout (:data:`recycling.IDLE_PROBE_TIMEOUT_SECS`,
the whole request), a status other than 200 or a body that is not the expected JSON is an
:class:`Answer` with ``error`` set, never an exception. What an answer means is the decisions'
business: :func:`for_recycling` and :func:`for_lifecycle` only translate it into their types.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Any

import aiohttp

from drain_router.decisions import lifecycle, recycling

PATH = "/admin/inflight"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One router's ``/admin/inflight`` as the probe saw it; ``error`` set means the probe failed."""

    code: int | None = None
    inflight: int | None = None
    queued: int = 0
    state: str | None = None
    idle_since: float | None = None
    served: int | None = None
    error: str | None = None


def url(pod_ip: str, port: int) -> str:
    host = f"[{pod_ip}]" if ipaddress.ip_address(pod_ip).version == 6 else pod_ip
    return f"http://{host}:{port}{PATH}"


def parse(code: int, text: str) -> Answer:
    """A response -> an :class:`Answer`. Every field is checked: an ``inflight`` or ``queued`` that
    is not a non-negative integer, a missing ``state``, a non-numeric ``idle_since`` or a missing
    ``served`` is a failed probe, not a guess. A missing ``queued`` is 0: a router older than the
    admission queue has nothing queued."""
    if code != 200:
        return Answer(code=code, error=f"HTTP {code}")
    try:
        body = json.loads(text)
    except ValueError as exc:
        return Answer(code=code, error=f"body is not JSON: {exc}")
    if not isinstance(body, dict):
        return Answer(code=code, error="body is not a JSON object")
    inflight, state, idle_since, served = (body.get(k) for k in ("inflight", "state", "idle_since", "served"))
    queued = body.get("queued", 0)  # a router older than the admission queue has none
    if not _count(inflight):
        return Answer(code=code, error=f"inflight={inflight!r} is not a count")
    if not _count(queued):
        return Answer(code=code, error=f"queued={queued!r} is not a count")
    if not isinstance(state, str):
        return Answer(code=code, error=f"state={state!r} is not a string")
    if not _count(served):
        return Answer(code=code, error=f"served={served!r} is not a count")
    if idle_since is not None and (isinstance(idle_since, bool) or not isinstance(idle_since, int | float)):
        return Answer(code=code, error=f"idle_since={idle_since!r} is not a time")
    return Answer(
        code=code,
        inflight=inflight,
        queued=queued,
        state=state,
        served=served,
        idle_since=None if idle_since is None else float(idle_since),
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


async def probe(
    session: aiohttp.ClientSession, pod_ip: str | None, port: int, timeout: float = recycling.IDLE_PROBE_TIMEOUT_SECS
) -> Answer:
    """Ask one router. Never raises for anything the network or the router does."""
    if not pod_ip:
        return Answer(error="pod has no podIP")
    try:
        target = url(pod_ip, port)
    except ValueError:
        return Answer(error=f"podIP {pod_ip!r} is not an IP address")
    try:
        async with session.get(target, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as response:
            text = await response.text()
            return parse(response.status, text)
    except TimeoutError:
        return Answer(error=f"no answer within {timeout:g}s from {target}")
    except (aiohttp.ClientError, UnicodeDecodeError, OSError) as exc:
        return Answer(error=f"{type(exc).__name__} from {target}: {exc}")


def for_recycling(answer: Answer, uid: str) -> recycling.ProbeResult:
    """The recycling candidate's answer (idle iff 200, valid, ``inflight == 0``, ``queued == 0``,
    ``state == serving``)."""
    return recycling.ProbeResult(
        uid=uid,
        code=answer.code,
        inflight=answer.inflight,
        queued=answer.queued,
        state=answer.state,
        error=answer.error,
    )


def for_lifecycle(answer: Answer, pod: str) -> lifecycle.RouterReport | lifecycle.ProbeFailure:
    """One pod's contribution to the idle clock. Only requests in flight or queued make a router busy here: a
    draining or starting router with none in flight has nothing to serve, and its ``idle_since`` and
    ``served`` are what the clock needs (a replacement still starting must not null the clock)."""
    if answer.error is not None or answer.inflight is None or answer.served is None:
        return lifecycle.ProbeFailure(pod=pod, error=answer.error or "incomplete answer")
    return lifecycle.RouterReport(
        pod=pod, inflight=answer.inflight, queued=answer.queued, idle_since=answer.idle_since, served=answer.served
    )


PORTS_PATH = "/admin/ports"


async def listening(
    session: aiohttp.ClientSession, pod_ip: str, port: int, timeout: float = recycling.IDLE_PROBE_TIMEOUT_SECS
) -> Any:
    """An activator pod's ``GET /admin/ports`` body (the JSON value), ``None`` on any failure (a
    status other than 200, no answer, not JSON): the pod then listens on nothing (fails closed)."""
    try:
        host = f"[{pod_ip}]" if ipaddress.ip_address(pod_ip).version == 6 else pod_ip
    except ValueError:
        return None
    target = f"http://{host}:{port}{PORTS_PATH}"
    try:
        async with session.get(target, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as response:
            if response.status != 200:
                return None
            return json.loads(await response.text())
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError, OSError, ValueError):
        return None
