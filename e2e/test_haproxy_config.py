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
