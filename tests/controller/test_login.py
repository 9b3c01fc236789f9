"""kopf's login in a pod reaches the API server at the address the rest of the controller uses:
``KUBERNETES_SERVICE_HOST:PORT``, as client-go's in-cluster config does, never a DNS name only the
cluster's DNS can resolve (a leader whose watches cannot resolve it holds the Lease and acts on
nothing)."""

from __future__ import annotations

import types
from typing import Any

import kopf
import pytest

from drain_router.controller import handlers

KOPF_SERVER = "https://kubernetes.default.svc"


def _info() -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=KOPF_SERVER, token="t0k3n", ca_path="/ca.crt", default_namespace="ns")


@pytest.mark.parametrize(
    ("environ", "server"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://10.0.0.1:6443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}, "https://[fd00:10:96::1]:443"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "https://10.96.0.1:443"),
        ({}, KOPF_SERVER),
    ],
    ids=["default-port", "other-port", "ipv6", "no-port", "not-in-a-pod"],
)
def test_the_service_account_login_names_the_api_server_by_its_address(environ: dict[str, str], server: str) -> None:
    found = handlers.in_cluster_address(_info(), environ)
    assert found is not None
    assert found.server == server
    # Everything else is kopf's: the token, the CA, the namespace.
    assert (found.token, found.ca_path, found.default_namespace) == ("t0k3n", "/ca.crt", "ns")


def test_no_service_account_is_no_in_cluster_login() -> None:
    assert handlers.in_cluster_address(None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None


def test_the_registered_login_handler_uses_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: _info())
    registry = kopf.OperatorRegistry()
    ctx: Any = types.SimpleNamespace(connection=None, settings=types.SimpleNamespace(activator_service=None))
    handlers.register(registry, ctx)
    logins = [h for h in registry._activities._handlers if h.activity == "authentication"]
    assert len(logins) == 1
    info = logins[0].fn(settings=kopf.OperatorSettings(), logger=None)
    assert info.server == "https://10.96.0.1:443"
