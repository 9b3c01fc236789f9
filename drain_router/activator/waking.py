"""Waking and watching one service (thin I/O around :mod:`drain_router.decisions.activator`): the
watcher each site runs for as long as it has a port, polling while it has requests (its ``demand``),
at most once per ``--poll-interval-secs`` whatever the clients send.

One poll is at most one read of the ModelService, one status patch and one list of its pods, so
the API calls the activator makes are bounded by its services (its assigned ports) over the poll
interval, never by its clients:

1. Read the ModelService (each poll while holding). 404: the held requests are answered 404, and new
   ones for a poll interval; 403 (the activator may not read it: not a service it serves) the same
   with 503 ``service_unavailable`` (:meth:`~.sites.ServiceSite.refuse`). Otherwise: its gRPC port
   is taken (none: the gRPC calls held are answered UNAVAILABLE now, before any wake,
   :func:`~.grpcsites.port_read`); its last cold start sets the ``Retry-After`` of the site's
   refusals; and if requests are still held and no wake is pending
   (:func:`~drain_router.decisions.activator.should_request_wake`) the status subresource is
   patched with ``wakeRequestedAt`` and the ``resourceVersion`` read. A 409 means another writer
   came first: the next poll reads again and decides again.
2. While forwarding, probe the router it forwards to; otherwise (or when that one stops answering
   ready), while requests are held, list the service's pods and probe each one's router
   (``/readyz`` on ``spec.router.port``, its traffic port): the first 200 makes the site forward to
   it (``http://<podIP>:<spec.router.port>``, and gRPC calls to ``spec.router.grpcPort``). None
   ready: the site holds again.
3. Polling stops when nothing is held or forwarded any more: at once while holding, after
   :data:`IDLE_FORWARDING_SECS` while forwarding; the next request starts it again (read, wake if
   asleep, find a pod), no sooner than a poll interval after the last poll.

An API call that gets no answer, or an unexpected status, is logged and tried again at the next
poll (anything else raised is logged as an error, and tried again too); the held requests keep
their place until their timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from drain_router import logs
from drain_router.activator import grpcsites, sites
from drain_router.activator.kube import Kube, Unanswered
from drain_router.activator.sites import ServiceSite
from drain_router.decisions import activator
from drain_router.decisions.capacity import Answer

log = logs.get("drain_router.activator")

#: A site forwarding with nothing held or in flight for this long stops being watched and holds
#: again: long enough for a client's next call in a conversation, short beside a sleep's idle time.
IDLE_FORWARDING_SECS = 60.0


async def wake(site: ServiceSite, kube: Kube, *, clock: Any = time.time) -> tuple[int, dict[str, Any] | None]:
    """Read the service, answer the gRPC calls it cannot serve, and ask for a wake if requests are
    still held and none is pending: ``(200, its object)``, or ``(403 or 404, None)`` when it may not
    be read or does not exist. One read and at most one patch. Raises :class:`Unanswered` (or
    ``LookupError`` for an unexpected answer)."""
    code, obj = await kube.get_modelservice(site.namespace, site.name)
    if code in (403, 404):
        return code, None
    if code != 200 or not isinstance(obj, dict):
        raise LookupError(f"reading the ModelService answered {code}")
    grpcsites.port_read(site, activator.router_grpc_port(obj.get("spec") or {}))
    status = activator.activation_status(obj.get("status"))
    site.set_cold_start(status.cold_start_seconds)
    if not activator.should_request_wake(status, len(site.gate)):
        return 200, obj
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    patch = activator.wake_patch(clock(), version)
    code, _ = await kube.patch_status(site.namespace, site.name, patch)
    if code == 200:
        log.info("activator.wake_requested", service=site.service, resource_version=version)
    elif code == 404:
        return 404, None
    elif code == 409:
        log.info("activator.wake_conflict", service=site.service, resource_version=version)
    else:
        raise LookupError(f"patching the ModelService's status answered {code}")
    return 200, obj


async def ready_pod(site: ServiceSite, kube: Kube, spec: Any) -> str | None:
    """The URL of the first listed pod whose router answers ready, or None."""
    selector = activator.label_selector(spec)
    if selector is None:
        raise LookupError("spec.podSelector has no matchLabels")
    code, pods = await kube.list_pods(site.namespace, selector)
    if code != 200:
        raise LookupError(f"listing the pods answered {code}")
    port = activator.router_port(spec)
    for ip in activator.candidate_pods(pods):
        if await kube.router_ready(ip, port):
            host = f"[{ip}]" if ":" in ip else ip
            return f"http://{host}:{port}"
    return None


async def watch(site: ServiceSite, kube: Kube, *, poll_interval: float, clock: Any = time.time) -> None:
    """The watcher of ``site``, until cancelled (see the module's docstring)."""
    loop = asyncio.get_running_loop()
    spec: Any = None
    port = activator.DEFAULT_ROUTER_PORT
    idle_since: float | None = None
    while True:
        await site.demand.wait()
        started = loop.time()
        try:
            if spec is None or not site.forwarding:  # (holding: read again each poll, wake again if it failed)
                code, obj = await wake(site, kube, clock=clock)
                if obj is None:
                    refused, answer = _refusal(site, code)
                    log.info("activator.refused", service=site.service, code=code, held=len(site.gate))
                    site.refuse(refused, answer, loop.time(), poll_interval)
                    site.hold()
                    spec = None
                else:
                    spec = obj.get("spec") or {}
                    port = activator.router_port(spec)
            url = site.url
            if spec is not None and (url is None or not await kube.router_ready(_host(url), port)):
                if len(site.gate) or site.gate.active:  # (a pod is looked for only for requests)
                    url = await ready_pod(site, kube, spec)
                else:
                    url = None
                if url is None:
                    site.hold()
                elif url != site.url:
                    await site.warm(url)
                    site.forward(url, loop.time())
        except (Unanswered, LookupError) as exc:
            log.warning("activator.poll_failed", service=site.service, error=str(exc))
        except Exception as exc:  # a bug of ours, or an answer shaped past what we check: say so loudly
            log.error("activator.watch_error", service=site.service, error=repr(exc), exc_info=exc)
        now = loop.time()
        if len(site.gate) or site.gate.active:
            idle_since = None
        elif not site.forwarding or (idle_since is not None and now - idle_since >= IDLE_FORWARDING_SECS):
            site.hold()
            site.demand.clear()  # (the next request sets it again)
            spec, idle_since = None, None
        elif idle_since is None:
            idle_since = now
        await asyncio.sleep(max(0.0, started + poll_interval - loop.time()))


def _refusal(site: ServiceSite, code: int) -> tuple[sites.Refused, Answer]:
    """A service's refusal after its read answered ``code``: 404 (it does not exist), 403 (the
    activator may not read it: no service of its own, said in words that name nothing)."""
    if code == 404:
        return site.table.not_found, sites.NOT_FOUND_ANSWER
    return site.table.unavailable, sites.UNAVAILABLE_ANSWER


def _host(url: str) -> str:
    """The pod's IP in a site's URL (``http://IP:PORT`` or ``http://[IPv6]:PORT``)."""
    host = url.split("://", 1)[1].rsplit(":", 1)[0]
    return host.strip("[]")
