"""The activator's listeners, one per port of the port map (:mod:`drain_router.decisions.service_ports`):
read every ``--poll-interval-secs`` (one GET of the ConfigMap, whatever the traffic), opened and
closed as the map changes (:func:`~drain_router.decisions.activator.plan_listeners`).

- An ``http`` port gets a :class:`~drain_router.http1.listener.TrafficListener` (HTTP/1.1 and
  WebSocket) whose picker is its service's site; a ``grpc`` port a
  :class:`~drain_router.grpc.listener.GrpcListener` (h2c) whose picker is the same site's gRPC side
  (:class:`~.grpcsites.GrpcPortSites`). The port a connection arrived on is the only thing that
  decides its service. An HTTP/2 preface on an ``http`` port is a request line the HTTP/1.1 parser
  refuses (400): it never reaches the site, never wakes anything.
- A port nobody is assigned has no listener: the kernel refuses the connection (RST), at no cost to
  the process. There is no shared traffic port either: one would answer every request with a
  refusal, so it could only be a surface for clients, never a way to a service.
- A port that leaves the map stops accepting (idle connections closed, busy ones after their
  response, gRPC ones after the GOAWAY sequence) and is closed once its connections are gone; a
  service with no port left is retired (:meth:`~.sites.Sites.retire`).
- Every listener shares one budget of client connections (:class:`OpenConnections`, the router's
  traffic share of the descriptors), so more ports never means more descriptors.
- ``GET /admin/ports`` on the admin listener lists the ports listened on now, ``{"ports": {"20000":
  "team-a/llama/http", ...}}``: the controller probes it before it makes this pod an endpoint of a
  service, so no connection is sent to a port not yet open.

A read of the map that gets no answer, or an answer other than 200 and 404, changes nothing (logged;
the next poll reads again); 404 is an empty map (the controller writes the map before any service
sleeps, so there is nothing to serve).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from drain_router import logs
from drain_router.activator import grpcsites
from drain_router.activator.kube import Kube, Unanswered
from drain_router.activator.settings import ActivatorSettings
from drain_router.activator.sites import Sites
from drain_router.decisions import activator, service_ports
from drain_router.decisions.service_ports import Assignment
from drain_router.grpc.listener import GrpcListener
from drain_router.http1.listener import TrafficListener
from drain_router.state import RouterState

log = logs.get("drain_router.activator")

Listener = TrafficListener | GrpcListener


class OpenConnections:
    """The client connections of every listener of the activator (open ports and closing ones): the
    count the shared ``connection_limit`` bounds."""

    __slots__ = ("ports",)

    def __init__(self, ports: Ports) -> None:
        self.ports = ports

    def __len__(self) -> int:
        return sum(_connections(listener) for listener in self.ports.all_listeners())


def _connections(listener: Listener) -> int:
    return len(listener.clients) if isinstance(listener, TrafficListener) else len(listener.conns)


class Ports:
    """The port map read, and the listeners it makes."""

    def __init__(
        self,
        state: RouterState,
        settings: ActivatorSettings,
        sites: Sites,
        kube: Kube,
        configmap: tuple[str, str],
        *,
        connection_limit: int,
    ) -> None:
        self.state = state
        self.settings = settings
        self.sites = sites
        self.kube = kube
        self.configmap = configmap
        self.host = state.config.proxy.host
        self.connect_timeout = float(state.config.proxy.upstream_connect_timeout_secs)
        self.connection_limit = connection_limit
        self.counted = OpenConnections(self)
        self.listening: dict[int, Assignment] = {}
        """The ports listened on now, whose each (``/admin/ports``)."""
        self.listeners: dict[int, Listener] = {}
        self.closing: list[Listener] = []
        """Listeners of ports that left the map, closed once their last connection is gone."""
        self.over: frozenset[Assignment] = frozenset()
        """Assignments past ``--max-services`` at the last read (warned about once each)."""
        self.stopped = False

    def all_listeners(self) -> Iterator[Listener]:
        yield from self.listeners.values()
        yield from self.closing

    def answer(self) -> dict[str, Any]:
        """``/admin/ports``' body."""
        return {"ports": service_ports.render(self.listening)}

    async def run(self) -> None:
        """Read the map every poll interval, until cancelled."""
        loop = asyncio.get_running_loop()
        interval = self.settings.poll_interval_secs
        while not self.stopped:
            started = loop.time()
            try:
                await self.poll()
            except Unanswered as exc:
                log.warning("activator.ports_unread", error=str(exc))
            except Exception as exc:  # a bug of ours: say so loudly, and read again
                log.error("activator.ports_error", error=repr(exc), exc_info=exc)
            await asyncio.sleep(max(0.0, started + interval - loop.time()))

    async def poll(self) -> None:
        """One read of the map (one GET), and the listeners made to follow it."""
        namespace, name = self.configmap
        code, obj = await self.kube.get_configmap(namespace, name)
        if code == 404:
            data: Any = {}
        elif code == 200 and isinstance(obj, dict):
            data = obj.get("data") or {}
        else:
            log.warning("activator.ports_unread", configmap=f"{namespace}/{name}", code=code)
            return
        if self.stopped:
            return
        table = service_ports.parse(data if isinstance(data, dict) else {})
        plan = activator.plan_listeners(table, self.listening, self.settings.max_services)
        for port in plan.close:
            self.close_port(port)
        for port, assignment in plan.open:
            await self.open_port(port, assignment)
        over = frozenset(plan.over)
        if over - self.over:  # (once per assignment newly past the bound, not once per poll)
            log.warning(
                "activator.max_services",
                max_services=self.settings.max_services,
                not_listened=sorted(str(a) for a in over - self.over),
            )
        self.over = over
        self._reap()
        self.sites.sweep()

    async def open_port(self, port: int, assignment: Assignment) -> None:
        site = self.sites.site(assignment.namespace, assignment.name)
        listener: Listener
        try:
            if assignment.protocol == service_ports.GRPC:
                picker = grpcsites.GrpcPortSites(site)
                listener = picker.listener = GrpcListener(
                    self.state,
                    None,
                    self.connect_timeout,
                    connection_limit=self.connection_limit,
                    sites=picker,
                    counted=self.counted,
                )
                await listener.bind(self.host, port)
            else:
                listener = TrafficListener(
                    self.state, None, connection_limit=self.connection_limit, sites=site, counted=self.counted
                )
                listener.exempt_paths = frozenset()  # every request of a sleeping service is held
                await listener.start(self.host, port)
        except OSError as exc:
            log.warning("activator.port_bind_failed", port=port, service=str(assignment), error=str(exc))
            if not site.ports:
                self.sites.retire(site)
            return
        site.ports.add(port)
        self.listening[port] = assignment
        self.listeners[port] = listener
        log.info("activator.port_opened", port=port, service=site.service, protocol=assignment.protocol)

    def close_port(self, port: int) -> None:
        assignment = self.listening.pop(port)
        listener = self.listeners.pop(port)
        listener.stop_accepting()
        self.closing.append(listener)
        site = self.sites.sites.get((assignment.namespace, assignment.name))
        if site is not None:
            site.ports.discard(port)
            if not site.ports:
                self.sites.retire(site)
        log.info("activator.port_closed", port=port, service=assignment.service, protocol=assignment.protocol)

    def _reap(self) -> None:
        for listener in [x for x in self.closing if not _connections(x)]:
            self.closing.remove(listener)
            listener.close()

    def stop_accepting(self) -> None:
        """Closing: the map is no longer read, and every listener stops accepting."""
        self.stopped = True
        for listener in self.all_listeners():
            listener.stop_accepting()

    def close(self) -> None:
        self.stopped = True
        for listener in list(self.all_listeners()):
            listener.close()

    async def grpc_closed(self, timeout: float) -> None:
        """The gRPC listeners closed and their connections' lingering closes ended, for at most
        ``timeout``."""
        grpc = [x for x in self.all_listeners() if isinstance(x, GrpcListener)]
        for listener in grpc:
            listener.close()
        await asyncio.gather(*(x.wait_closed(timeout) for x in grpc))


PORTS_KEY = web.AppKey("activator_ports", Ports)


async def admin_ports(request: web.Request) -> web.Response:
    """``GET /admin/ports``: the ports listened on now, whose each."""
    return web.json_response(request.app[PORTS_KEY].answer())


def install(app: web.Application, ports: Ports) -> None:
    """``/admin/ports`` on the admin app."""
    app[PORTS_KEY] = ports
    app.router.add_get("/admin/ports", admin_ports)


def configmap(settings: ActivatorSettings, namespace: str | None) -> tuple[str, str]:
    """``--ports-configmap`` as ``(namespace, name)`` (``ValueError`` when it names none)."""
    if settings.ports_configmap is None:
        raise ValueError("--ports-configmap is required")
    return activator.configmap_ref(settings.ports_configmap, namespace)
