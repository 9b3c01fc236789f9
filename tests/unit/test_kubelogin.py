"""Where the controller and the activator look for the API server (``drain_router.kubelogin``): the
service account in a pod, else each path of KUBECONFIG, else ~/.kube/config; neither: NoCluster
naming where it looked."""

from __future__ import annotations

from pathlib import Path

import pytest

from drain_router import kubelogin


@pytest.fixture
def account(tmp_path: Path) -> Path:
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("t0k3n\n")
    return tmp_path / "sa"


@pytest.mark.parametrize(
    ("environ", "server"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://10.0.0.1:6443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}, "https://[fd00:10:96::1]:443"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "https://10.96.0.1:443"),
        # The service account wins over a kubeconfig (as kubectl's in-cluster client does).
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBECONFIG": "/etc/hosts"}, "https://10.96.0.1:443"),
    ],
    ids=["default-port", "other-port", "ipv6", "no-port", "before-kubeconfig"],
)
def test_in_a_pod_the_service_account(account: Path, environ: dict[str, str], server: str) -> None:
    found = kubelogin.locate(environ, account)
    assert found == kubelogin.InCluster(server=server, token_path=account / "token", ca_path=account / "ca.crt")
    assert found.token() == "t0k3n"


def test_the_token_is_read_again_for_each_call(account: Path) -> None:
    found = kubelogin.locate({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, account)
    assert isinstance(found, kubelogin.InCluster)
    (account / "token").write_text("rotated")
    assert found.token() == "rotated"


@pytest.mark.parametrize(
    ("listed", "exist", "named"),
    [
        (["a"], ["a"], ["a"]),
        (["missing", "b"], ["b"], ["missing", "b"]),  # each path of the list, the missing ones skipped
        (["a", "b"], ["a", "b"], ["a", "b"]),
        ([], [".kube/config"], [".kube/config"]),  # no KUBECONFIG: ~/.kube/config
    ],
    ids=["one", "second-of-two", "both", "home"],
)
def test_out_of_a_pod_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed: list[str], exist: list[str], named: list[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in exist:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    environ = {"KUBECONFIG": ":".join(str(tmp_path / n) for n in listed)} if listed else {}
    found = kubelogin.locate(environ, tmp_path / "no-account")
    assert isinstance(found, kubelogin.Kubeconfig)
    assert found.paths == tuple(tmp_path / n for n in named)
    assert found.not_in_cluster == "no KUBERNETES_SERVICE_HOST"


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({}, "no KUBERNETES_SERVICE_HOST"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "no service account token at"),  # a host, no token
    ],
)
def test_neither_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], why: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(kubelogin.NoCluster) as raised:
        kubelogin.locate(environ, tmp_path / "no-account")
    assert why in str(raised.value) and str(tmp_path / ".kube" / "config") in str(raised.value)
    listed = {"KUBECONFIG": f"{tmp_path}/x:{tmp_path}/y", **environ}
    with pytest.raises(kubelogin.NoCluster, match=f"no kubeconfig at {tmp_path}/x, {tmp_path}/y$"):
        kubelogin.locate(listed, tmp_path / "no-account")


async def test_a_kubeconfig_s_token_and_server_reach_the_activator_s_access(tmp_path: Path) -> None:
    """The kubeconfig goes through the controller's loader: its server and its token (bearer), no
    TLS for an http:// server."""
    path = tmp_path / "config"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:6443/'}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    found = kubelogin.locate({"KUBECONFIG": str(path)}, tmp_path / "no-account")
    access = await kubelogin.access(found)
    assert (access.server, access.ssl) == ("http://127.0.0.1:6443", False)
    assert access.authorization is not None and await access.authorization() == "Bearer abc"
    configuration = await kubelogin.client_configuration(found)
    assert configuration.host.rstrip("/") == access.server
