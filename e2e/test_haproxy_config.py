"""The harness's HAProxy configuration is one HAProxy itself accepts, with the settings the e2e relies on."""

from __future__ import annotations

import subprocess
from pathlib import Path

from e2e import haproxy


def test_rendered_config_is_valid(haproxy_bin: str, tmp_path: Path) -> None:
    text = haproxy.render_config(
        port=18080,
        servers=[haproxy.Server("a", 18081), haproxy.Server("b", 18082, check_port=18083)],
        stats_socket=tmp_path / "s.sock",
        inter_ms=200,
        fall=1,
        rise=1,
    )
    for needed in (
        "retries 0",
        "option http-no-delay",
        "timeout tunnel 1h",  # WebSocket sessions after their 101
        "http-reuse always",
        "option httpchk GET /readyz",
        "check inter 200ms fall 1 rise 1",
        "server b 127.0.0.1:18082 port 18083",  # b's health checks go to its readiness stand-in
    ):
        assert needed in text
    (tmp_path / "h.cfg").write_text(text)
    check = subprocess.run(
        [haproxy_bin, "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_grpc_side_is_valid(haproxy_bin: str, tmp_path: Path) -> None:
    """The gRPC frontend takes h2c, its servers get h2c, and their checks are HTTP/1.1 /readyz on the
    admin port: with the servers' ``proto h2`` alone HAProxy would check over h2 too, which the
    router's admin port does not speak."""
    text = haproxy.render_config(
        port=18080,
        servers=[haproxy.Server("a", 18081)],
        stats_socket=tmp_path / "s.sock",
        grpc_port=18090,
        grpc_servers=[haproxy.Server("a", 18091, check_port=18092)],
    )
    grpc_side = text[text.index("frontend grpc_clients") :]
    for needed in (
        "bind 127.0.0.1:18090 proto h2",
        f"backend {haproxy.GRPC_BACKEND}",
        "option httpchk GET /readyz",
        "http-reuse always",
        "check inter 200ms fall 1 rise 1",
        "server a 127.0.0.1:18091 port 18092 proto h2 check-proto h1",
    ):
        assert needed in grpc_side
    (tmp_path / "h.cfg").write_text(text)
    check = subprocess.run(
        [haproxy_bin, "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr
