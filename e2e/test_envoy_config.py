"""The harness's Envoy configuration is one Envoy itself accepts, with the settings the e2e relies on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e import envoy


def test_rendered_config_is_valid(envoy_bin: str, tmp_path: Path) -> None:
    text = envoy.render_config(
        port=18080,
        admin_port=18090,
        servers=[envoy.Server("a", 18081), envoy.Server("b", 18082)],
        access_log=tmp_path / "access.log",
        interval_ms=200,
    )
    cluster = json.loads(text)["static_resources"]["clusters"][0]
    check = cluster["health_checks"][0]
    assert check["http_health_check"]["path"] == "/readyz"
    assert (
        check["interval"],
        check["no_traffic_interval"],
        check["unhealthy_threshold"],
        check["healthy_threshold"],
    ) == ("0.200s", "0.200s", 1, 1)
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}, "update_merge_window": "0s"}
    assert "retry_policy" not in text
    manager = json.loads(text)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["upgrade_configs"] == [{"upgrade_type": "websocket"}]
    assert all(a["socket_address"]["address"] == "127.0.0.1" for a in _addresses(json.loads(text)))
    (tmp_path / "envoy.json").write_text(text)
    result = subprocess.run(
        [envoy_bin, "--mode", "validate", "-c", str(tmp_path / "envoy.json"), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grpc_side_is_valid(envoy_bin: str, tmp_path: Path) -> None:
    """The gRPC listener routes to a cluster that speaks h2c to the routers' gRPC ports and checks
    them with grpc.health.v1, with the HTTP cluster's LB settings; Envoy accepts it."""
    text = envoy.render_config(
        port=18080,
        admin_port=18090,
        servers=[envoy.Server("a", 18081)],
        access_log=tmp_path / "access.log",
        grpc_port=18070,
        grpc_servers=[envoy.Server("a", 18071)],
    )
    resources = json.loads(text)["static_resources"]
    http, grpc = resources["clusters"]
    assert grpc["name"] == envoy.GRPC_CLUSTER
    options = grpc["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    assert grpc["health_checks"][0]["grpc_health_check"] == {}
    assert grpc["common_lb_config"] == http["common_lb_config"]
    listener = resources["listeners"][1]
    assert listener["address"]["socket_address"]["port_value"] == 18070
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] == envoy.GRPC_CLUSTER
    (tmp_path / "envoy.json").write_text(text)
    result = subprocess.run(
        [envoy_bin, "--mode", "validate", "-c", str(tmp_path / "envoy.json"), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _addresses(node: object) -> list[dict]:
    """Every ``address`` object in the config, however deep."""
    found: list[dict] = []
    if isinstance(node, dict):
        if isinstance(node.get("address"), dict) and "socket_address" in node["address"]:
            found.append(node["address"])
        for value in node.values():
            found += _addresses(value)
    elif isinstance(node, list):
        for value in node:
            found += _addresses(value)
    return found
