"""Waking and watching one service (thin I/O around :mod:`drain_router.decisions.activator`): the
watcher a site runs while it has requests to hold or forward.

1. Read the ModelService (each poll while holding). Not found: the held requests are answered 404 (:meth:`~.sites.ServiceSite.not_found`).
   Otherwise its last cold start sets the ``Retry-After`` of the site's refusals, and if no wake is
   pending (:func:`~drain_router.decisions.activator.should_request_wake`) the status subresource is
   patched with ``wakeRequestedAt`` and the ``resourceVersion`` read; a 409 means another writer
   came first: read again and decide again.
2. Every ``--poll-interval-secs``: while forwarding, probe the router it forwards to; otherwise (or
   when that one stops answering ready) list the service's pods and probe each one's router
   (``/readyz`` on ``spec.router.port``, its traffic port): the first 200 makes the site forward to
   it (``http://<podIP>:<spec.router.port>``, and gRPC calls to ``spec.router.grpcPort``; a
   service with none has its gRPC calls answered UNAVAILABLE). None ready: the site holds again.
3. The watcher ends when nothing is held or forwarded any more: at once while holding, after
   :data:`IDLE_FORWARDING_SECS` while forwarding (the route usually points back at the model Service
   by then, and the next request starts a fresh watcher: read, wake if asleep, find a pod).

An API call that gets no answer, or an unexpected status, is logged and tried again at the next
poll (anything else raised is logged as an error, and tried again too); the held requests keep
their place until their timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from drain_router import logs
from drain_router.activator import grpcsites
from drain_router.activator.kube import Kube, Unanswered
from drain_router.activator.sites import ServiceSite
from drain_router.decisions import activator

log = logs.get("drain_router.activator")

#: A site forwarding with nothing held or in flight for this long stops being watched and holds
#: again: long enough for a client's next call in a conversation, short beside a sleep's idle time.
IDLE_FORWARDING_SECS = 60.0

#: Read-decide-patch rounds a wake may take when other writers keep winning (each 409 re-reads).
MAX_WAKE_ROUNDS = 5


async def wake(site: ServiceSite, kube: Kube, *, clock: Any = time.time) -> dict[str, Any] | None:
    """Read the service and ask for a wake unless one is pending; its object, or None when it does
    not exist. Raises :class:`Unanswered` (or ``LookupError`` for an unexpected answer)."""
    for _ in range(MAX_WAKE_ROUNDS):
        code, obj = await kube.get_modelservice(site.namespace, site.name)
        if code == 404:
            return None
        if code != 200 or not isinstance(obj, dict):
            raise LookupError(f"reading the ModelService answered {code}")
        status = activator.activation_status(obj.get("status"))
        site.set_cold_start(status.cold_start_seconds)
        if not activator.should_request_wake(status):
            return obj
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        patch = activator.wake_patch(clock(), version)
        code, _ = await kube.patch_status(site.namespace, site.name, patch)
        if code == 200:
            log.info("activator.wake_requested", service=site.service, resource_version=version)
            return obj
        if code == 404:
            return None
        if code != 409:
            raise LookupError(f"patching the ModelService's status answered {code}")
    raise LookupError("the wake lost to other writers too often")


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
    """The watcher of ``site`` (see the module's docstring)."""
    loop = asyncio.get_running_loop()
    spec: Any = None
    port = activator.DEFAULT_ROUTER_PORT
    idle_since: float | None = None
    while True:
        try:
            if spec is None or not site.forwarding:  # (holding: read again each poll, wake again if it failed)
                obj = await wake(site, kube, clock=clock)
                if obj is None:
                    log.info("activator.not_found", service=site.service, held=len(site.gate))
                    site.not_found(loop.time(), poll_interval)
                    site.hold()
                    return
                spec = obj.get("spec") or {}
                port = activator.router_port(spec)
                grpcsites.port_read(site, activator.router_grpc_port(spec))
            url = site.url
            if url is None or not await kube.router_ready(_host(url), port):
                url = await ready_pod(site, kube, spec)
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
        busy = len(site.gate) or site.gate.active
        if busy:
            idle_since = None
        elif not site.forwarding or (idle_since is not None and now - idle_since >= IDLE_FORWARDING_SECS):
            site.hold()
            return
        elif idle_since is None:
            idle_since = now
        await asyncio.sleep(poll_interval)


def _host(url: str) -> str:
    """The pod's IP in a site's URL (``http://IP:PORT`` or ``http://[IPv6]:PORT``)."""
    host = url.split("://", 1)[1].rsplit(":", 1)[0]
    return host.strip("[]")
