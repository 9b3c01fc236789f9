"""A gateway fed from the cluster: a real HAProxy configured from the HTTPRoutes, GRPCRoutes,
Services and EndpointSlices the API server holds, the way a Gateway API implementation reads them.

It watches those kinds (and ReferenceGrants), and ``delay_secs`` after each change it brings HAProxy to what it saw
then, the way HAProxy-based ingress controllers do: a change of endpoints only through the runtime
API (each backend has a fixed set of server slots; a new address takes a free slot and is set
``ready``, a gone one is set to ``maint``, which sends it no new request and leaves the requests it
carries alone); a change of routes (hosts, header filters, a route added or removed) by a reload
(master-worker mode: the new worker takes new connections, the old one answers one more request on
each kept-alive connection it holds, then closes it). That delay is the propagation a real gateway
has between the API server and its data plane.

What it reads, as implementations do:

- an HTTPRoute's ``hostnames`` (matched against the Host header; none: every host), its first
  rule's ``backendRefs`` (Services, in the route's namespace or another one) and that rule's
  ``RequestHeaderModifier`` filters (``set`` and ``add``);
- a GRPCRoute's the same way, on a listener of its own that speaks HTTP/2 with prior knowledge
  (h2c, as gRPC clients do) and HTTP/2 to the backends (``proto h2``), ``:authority`` as the host;
  a route's method matches are not read (every call to its hosts goes to its first rule);
- a Service's port (the ``backendRef``'s) and its name, which picks the EndpointSlice port;
- EndpointSlice conditions: the ``ready`` endpoints take traffic; when none is ready, the
  ``serving`` ones that are terminating do (what Envoy-based gateways and kube-proxy do); the rest
  take none;
- ReferenceGrants: a backendRef to a Service in another namespace is followed only when a grant in
  that namespace admits HTTPRoutes from the route's namespace to that Service (or to every Service);
  without one the ref reaches nothing, as a conformant gateway refuses it.

A request for no route is HAProxy's 503 (no server); the gateway never retries (``retries 0``) and
does not health-check: what the EndpointSlices say is all it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

from drain_router_dev.kube.api import Api, ApiError, Json
from drain_router_dev.process import LOOPBACK, free_port

KINDS = {
    "HTTPRoute": "/apis/gateway.networking.k8s.io/v1/httproutes",
    "GRPCRoute": "/apis/gateway.networking.k8s.io/v1/grpcroutes",
    "Service": "/api/v1/services",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/endpointslices",
    "ReferenceGrant": "/apis/gateway.networking.k8s.io/v1beta1/referencegrants",
}


@dataclasses.dataclass(frozen=True)
class Backend:
    """One route's backend in HAProxy: its name, the hosts it answers, header edits, servers, and
    whether it is a GRPCRoute's (HTTP/2 both sides) or an HTTPRoute's."""

    name: str
    hosts: tuple[str, ...]
    set_headers: tuple[tuple[str, str], ...]
    add_headers: tuple[tuple[str, str], ...]
    servers: tuple[tuple[str, int], ...]
    grpc: bool = False


def _key(obj: Json) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def endpoints(slices: list[Json], namespace: str, service: Json, port: int) -> tuple[tuple[str, int], ...]:
    """The addresses a backendRef to ``service``:``port`` reaches: ready ones, else serving ones."""
    port_name = next((p.get("name", "") for p in service["spec"].get("ports", []) if p["port"] == port), None)
    if port_name is None:
        return ()
    ready: list[tuple[str, int]] = []
    serving: list[tuple[str, int]] = []
    for item in slices:
        labels = item["metadata"].get("labels", {})
        if (
            item["metadata"].get("namespace") != namespace
            or labels.get("kubernetes.io/service-name") != service["metadata"]["name"]
        ):
            continue
        target = next((p["port"] for p in item.get("ports") or [] if p.get("name", "") == port_name), None)
        if target is None:
            continue
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions", {})
            for address in endpoint.get("addresses", []):
                if conditions.get("ready"):
                    ready.append((address, target))
                elif conditions.get("serving"):
                    serving.append((address, target))
    return tuple(sorted(ready or serving))


def granted(grants: list[Json], route_namespace: str, namespace: str, service: str, kind: str = "HTTPRoute") -> bool:
    """Whether a route of ``kind`` in ``route_namespace`` may name the Service ``namespace``/``service``:
    the same namespace, or a ReferenceGrant there admitting it."""
    if namespace == route_namespace:
        return True
    for grant in grants:
        if grant["metadata"].get("namespace") != namespace:
            continue
        spec = grant.get("spec") or {}
        admits = any(
            f.get("group") == "gateway.networking.k8s.io" and f.get("kind") == kind
            and f.get("namespace") == route_namespace
            for f in spec.get("from") or []
        )  # fmt: skip
        reaches = any(
            t.get("group", "") == "" and t.get("kind") == "Service" and t.get("name", service) == service
            for t in spec.get("to") or []
        )
        if admits and reaches:
            return True
    return False


def backends(
    routes: list[Json], grpc_routes: list[Json], services: list[Json], slices: list[Json], grants: list[Json]
) -> list[Backend]:
    """Pure: what the gateway serves, from the objects as the API server holds them: the HTTPRoutes'
    backends, then the GRPCRoutes'."""
    by_name = {_key(s): s for s in services}
    found: list[Backend] = []
    tagged = [(r, False) for r in sorted(routes, key=_key)] + [(r, True) for r in sorted(grpc_routes, key=_key)]
    for route, grpc in tagged:
        namespace, name = _key(route)
        kind = "GRPCRoute" if grpc else "HTTPRoute"
        rules = route["spec"].get("rules") or [{}]
        rule = rules[0]
        servers: list[tuple[str, int]] = []
        for ref in rule.get("backendRefs") or []:
            if ref.get("kind", "Service") != "Service":
                continue
            ref_namespace = ref.get("namespace", namespace)
            service = by_name.get((ref_namespace, ref["name"]))
            if service is not None and granted(grants, namespace, ref_namespace, ref["name"], kind):
                servers.extend(endpoints(slices, ref_namespace, service, int(ref.get("port", 80))))
        sets: list[tuple[str, str]] = []
        adds: list[tuple[str, str]] = []
        for filt in rule.get("filters") or []:
            if filt.get("type") == "RequestHeaderModifier":
                modifier = filt.get("requestHeaderModifier", {})
                sets.extend((h["name"], h["value"]) for h in modifier.get("set", []))
                adds.extend((h["name"], h["value"]) for h in modifier.get("add", []))
        found.append(Backend(
            f"{'g' if grpc else 'r'}_{namespace}_{name}".replace("-", "_").replace(".", "_"),
            tuple(h.lower() for h in route["spec"].get("hostnames", [])),
            tuple(sets), tuple(adds), tuple(servers), grpc,
        ))  # fmt: skip
    return found


async def list_when_ready(api: Api, where: str, timeout: float = 30.0) -> Json:
    """A list, asked again while the API server answers 429 (``storage is (re)initializing``: the
    watch cache of a kind whose CRD was just established), as its ``Retry-After`` says."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, listed = await api.request("GET", where)
            return listed
        except ApiError as exc:
            if exc.status != 429 or time.monotonic() > deadline:
                raise
            details = exc.body.get("details") or {}
            await asyncio.sleep(min(1.0, float(details.get("retryAfterSeconds") or 1)))


#: Server slots per backend: more than the pods a scenario runs at once, old and new.
SLOTS = 16
Slot = tuple[str, int] | None


def assign(current: list[Slot], wanted: tuple[tuple[str, int], ...], cursor: int) -> tuple[list[Slot], int]:
    """Pure: each wanted server keeps its slot; a new one takes the next free slot after ``cursor``
    (a slot just freed is taken last: its old server may still be finishing requests). The new slots
    and cursor."""
    slots = [slot if slot in wanted else None for slot in current]
    for server in wanted:
        if server in slots:
            continue
        for step in range(1, SLOTS + 1):
            index = (cursor + step) % SLOTS
            if slots[index] is None and current[index] is None:
                break
        else:
            index = next((i for i in range(SLOTS) if slots[i] is None), -1)
            if index < 0:
                raise RuntimeError(f"more than {SLOTS} servers in one backend")
        slots[index] = server
        cursor = index
    return slots, cursor


def commands(backend: str, before: list[Slot], after: list[Slot]) -> list[str]:
    """Pure: the runtime API commands from ``before`` to ``after``; servers added before any is
    removed, so a backend never has none while it changes."""
    adds: list[str] = []
    removes: list[str] = []
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        if old == new:
            continue
        if new is None:
            removes.append(f"set server {backend}/s{index} state maint")
        else:
            adds.append(f"set server {backend}/s{index} addr {new[0]} port {new[1]}")
            adds.append(f"set server {backend}/s{index} state ready")
    return adds + removes


def structure(found: list[Backend]) -> list[Backend]:
    """What only a reload can change: the backends without their servers."""
    return [dataclasses.replace(backend, servers=()) for backend in found]


def render(port: int, grpc_port: int, found: list[Backend], socket: Path, slots: dict[str, list[Slot]]) -> str:
    """HAProxy configuration text. Pure. Two listeners: ``port`` for the HTTPRoutes (HTTP/1.1),
    ``grpc_port`` for the GRPCRoutes (HTTP/2 with prior knowledge, h2c, as gRPC clients speak it,
    and to the backends). ``socket``: the stats socket that hands the listeners to the next worker
    at a reload (no connection refused while it takes over)."""
    lines = [
        "global",
        "    maxconn 4096",
        "    hard-stop-after 300s",
        "    log stdout format raw local0",
        f"    stats socket {socket} mode 600 level admin expose-fd listeners",
        "",
        "defaults",
        "    log global",
        '    log-format "%pid %ci:%cp [%tr] %b/%s(%si:%sp) %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc %{+Q}r"',
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 120s",
        "    timeout server 120s",
        "    timeout http-keep-alive 10s",
        "    timeout tunnel 120s",
        "    retries 0",
        "",
    ]
    for frontend, bind, grpc in (
        ("gateway", f"{LOOPBACK}:{port}", False),
        ("grpc", f"{LOOPBACK}:{grpc_port} proto h2", True),
    ):
        lines += [
            f"frontend {frontend}",
            f"    bind {bind}",
            # HTTP/2's :authority is the Host header here.
            "    http-request set-var(txn.host) req.hdr(host),field(1,:),lower",
        ]
        catch_all = None
        for backend in found:
            if backend.grpc != grpc:
                continue
            if backend.hosts:
                hosts = " ".join(backend.hosts)
                lines.append(f"    use_backend {backend.name} if {{ var(txn.host) -m str {hosts} }}")
            elif catch_all is None:
                catch_all = backend.name
        if catch_all is not None:
            lines.append(f"    default_backend {catch_all}")
        lines.append("")
    for backend in found:
        lines += ["", f"backend {backend.name}", "    balance roundrobin", "    http-reuse always"]
        lines += [f'    http-request set-header {n} "{v}"' for n, v in backend.set_headers]
        lines += [f'    http-request add-header {n} "{v}"' for n, v in backend.add_headers]
        h2 = " proto h2" if backend.grpc else ""
        for index, slot in enumerate(slots[backend.name]):
            lines.append(
                f"    server s{index} {slot[0]}:{slot[1]}{h2}"
                if slot
                else f"    server s{index} {LOOPBACK}:1 disabled{h2}"
            )
    return "\n".join(lines) + "\n"


class Gateway:
    """The gateway process and the watches that feed it."""

    def __init__(self, api: Api, binary: str, workdir: Path, delay_secs: float = 1.0) -> None:
        self.api = api
        self.binary = binary
        self.workdir = workdir
        self.delay_secs = delay_secs
        self.port = free_port()
        self.grpc_port = free_port()
        self.objects: dict[str, dict[tuple[str, str], Json]] = {kind: {} for kind in KINDS}
        self.config = workdir / "haproxy.cfg"
        self.socket = workdir / "haproxy.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.applied: list[Backend] = []
        self.slots: dict[str, list[Slot]] = {}
        self.cursor = 0
        self.reloads = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._queue: asyncio.Queue[tuple[float, list[Backend]]] = asyncio.Queue()
        """What was seen, and when it is due (the loop's clock)."""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def grpc_target(self) -> str:
        """Where a gRPC client connects (``host:port``, h2c)."""
        return f"{LOOPBACK}:{self.grpc_port}"

    def wanted(self) -> list[Backend]:
        return backends(*(list(self.objects[kind].values()) for kind in KINDS))

    async def start(self) -> None:
        for kind in KINDS:
            version = await self._list(kind)
            self._tasks.append(asyncio.create_task(self._watch(kind, version)))
        self.applied = self.wanted()
        self._place(self.applied)
        self.config.write_text(render(self.port, self.grpc_port, self.applied, self.socket, self.slots))
        log = (self.workdir / "haproxy.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, "-W", "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        await self._listening()
        self._tasks.append(asyncio.create_task(self._propagate()))
        self._tasks.append(asyncio.create_task(self._applier()))

    async def _listening(self) -> None:
        for port in (self.port, self.grpc_port):
            await self._listening_on(port)

    async def _listening_on(self, port: int) -> None:
        for _ in range(300):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(self.workdir / 'haproxy.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(LOOPBACK, port)
                writer.close()
                return
            await asyncio.sleep(0.05)  # polled: HAProxy says nowhere when it listens
        raise RuntimeError(f"haproxy never listened on {port}")

    async def _list(self, kind: str) -> str:
        listed = await list_when_ready(self.api, KINDS[kind])
        self.objects[kind] = {_key(item): item for item in listed.get("items", [])}
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, kind: str, version: str) -> None:
        while True:
            try:
                async with contextlib.aclosing(self.api.watch(KINDS[kind], version)) as events:
                    async for event in events:
                        obj = event["object"]
                        if event["type"] == "BOOKMARK":
                            version = obj["metadata"]["resourceVersion"]
                            continue
                        if event["type"] == "ERROR":
                            raise ApiError("WATCH", KINDS[kind], int(obj.get("code", 0)), obj)
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] == "DELETED":
                            self.objects[kind].pop(_key(obj), None)
                        else:
                            self.objects[kind][_key(obj)] = obj
                        self._changed.set()
            except (ApiError, OSError, ValueError):
                # 410 Gone and broken streams alike: list again and watch from there.
                version = await self._list(kind)
                self._changed.set()

    async def _propagate(self) -> None:
        """Each change, ``delay_secs`` later: the configuration as it was seen then, reloaded."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            seen = self.wanted()
            self._queue.put_nowait((asyncio.get_running_loop().time() + self.delay_secs, seen))

    async def _applier(self) -> None:
        """Applies what was seen, in order, each ``delay_secs`` after it was seen."""
        loop = asyncio.get_running_loop()
        while True:
            due, seen = await self._queue.get()
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            await self._apply(seen)

    def _place(self, found: list[Backend]) -> dict[str, list[Slot]]:
        """Slots for every backend of ``found``; the slots they had before."""
        before = {name: list(slots) for name, slots in self.slots.items()}
        for backend in found:
            current = self.slots.get(backend.name, [None] * SLOTS)
            self.slots[backend.name], self.cursor = assign(current, backend.servers, self.cursor)
        return before

    async def _apply(self, seen: list[Backend]) -> None:
        if self.process is None or self.process.poll() is not None or seen == self.applied:
            return
        reload = structure(seen) != structure(self.applied)
        before = self._place(seen)
        self.applied = seen
        with (self.workdir / "applied.log").open("a") as history:
            history.write(f"{time.time():.3f} {'reload' if reload else 'runtime'} {seen}\n")
        if reload:
            self.config.write_text(render(self.port, self.grpc_port, seen, self.socket, self.slots))
            os.kill(self.process.pid, signal.SIGUSR2)
            self.reloads += 1
            return
        lines: list[str] = []
        for backend in seen:
            lines += commands(backend.name, before.get(backend.name, [None] * SLOTS), self.slots[backend.name])
        if lines:
            await self._command("; ".join(lines))
        # The configuration file follows too, for the next reload and for the post-mortem.
        self.config.write_text(render(self.port, self.grpc_port, seen, self.socket, self.slots))

    async def _command(self, text: str) -> str:
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        writer.write(text.encode() + b"\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer.decode()

    def servers(self, host: str, *, grpc: bool = False) -> tuple[tuple[str, int], ...]:
        """What the gateway sends requests for ``host`` to right now (gRPC calls: ``grpc``)."""
        for backend in self.applied:
            if backend.grpc == grpc and host.lower() in backend.hosts:
                return backend.servers
        return ()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(self.process.wait, 10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


__all__ = ["Backend", "Gateway", "assign", "backends", "commands", "endpoints", "granted", "list_when_ready", "render"]
