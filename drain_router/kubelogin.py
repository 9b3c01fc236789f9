"""Finding the Kubernetes API server and logging in, one rule for the controller and the activator,
as kubectl does:

1. In a pod: the service account (``KUBERNETES_SERVICE_HOST`` and its token file). The API server is
   ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` (443 when the port is unset), as
   client-go's in-cluster config names it, never a DNS name; the token is read again for each call
   (the kubelet rotates it).
2. Else the kubeconfig: every path of ``KUBECONFIG`` (``os.pathsep``-separated, merged as kubectl
   merges them), else ``~/.kube/config``. kubernetes_asyncio's loader reads it (its current context:
   server, CA, client certificate and key, token or token file, basic auth, exec and auth-provider
   plugins with their refreshes, ``insecure-skip-tls-verify``), so both commands accept the same
   kubeconfigs.
3. Neither: :class:`NoCluster`, whose message names where it looked; the command logs it in one
   line with :data:`REMEDY` and exits :data:`EXIT_NO_CLUSTER`.

:func:`locate` decides (no I/O beyond looking at the files); :func:`client_configuration` gives
kubernetes_asyncio's ``Configuration`` (the controller's client), :func:`access` what a plain aiohttp
client needs (the activator's). kubernetes_asyncio is imported only to read a kubeconfig: in a pod
the activator never loads it.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts the pod's service account: ``token``, ``ca.crt``, ``namespace``."""

EXIT_NO_CLUSTER = 2
"""The exit status when there is no cluster to talk to: a configuration error, 2 as for ``serve``."""

REMEDY = (
    "run it in the cluster (the chart's Deployment and its service account), "
    "or point KUBECONFIG at a kubeconfig for the cluster"
)


class NoCluster(Exception):
    """Neither an in-cluster service account nor a usable kubeconfig: no API server to talk to."""


@dataclasses.dataclass(frozen=True, slots=True)
class InCluster:
    """The pod's service account."""

    server: str
    token_path: Path
    ca_path: Path

    def token(self) -> str:
        return self.token_path.read_text().strip()


@dataclasses.dataclass(frozen=True, slots=True)
class Kubeconfig:
    """Not in a pod: the kubeconfig files to read (at least one exists)."""

    paths: tuple[Path, ...]
    not_in_cluster: str
    """Why the service account was not used (for the message if the kubeconfig is unusable)."""


def kubeconfig_paths(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Where a kubeconfig is looked for: every path in ``KUBECONFIG``, else ``~/.kube/config``."""
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in listed or ["~/.kube/config"]]


def in_cluster_server(environ: Mapping[str, str] = os.environ) -> str | None:
    """``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` (the kubelet sets both in every
    pod; 443 without the port), an IPv6 address bracketed; None out of a pod."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        return None
    port = environ.get("KUBERNETES_SERVICE_PORT") or "443"
    bracketed = f"[{host}]" if ":" in host or "%" in host else host
    return f"https://{bracketed}:{port}"


def locate(environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> InCluster | Kubeconfig:
    """The service account in a pod, else the kubeconfig files; ``NoCluster`` naming where it looked."""
    server = in_cluster_server(environ)
    token = account / "token"
    if server and token.is_file():
        return InCluster(server=server, token_path=token, ca_path=account / "ca.crt")
    not_in_cluster = f"no service account token at {token}" if server else "no KUBERNETES_SERVICE_HOST"
    paths = kubeconfig_paths(environ)
    if not any(p.is_file() for p in paths):
        where = ", ".join(str(p) for p in paths)
        raise NoCluster(f"not in a cluster ({not_in_cluster}) and no kubeconfig at {where}")
    return Kubeconfig(paths=tuple(paths), not_in_cluster=not_in_cluster)


async def client_configuration(found: InCluster | Kubeconfig) -> Configuration:
    """kubernetes_asyncio's ``Configuration`` for ``found``; ``NoCluster`` if the kubeconfig is unusable."""
    try:  # (the controller's extra, in the image; imported here only: the activator loads it only to
        # read a kubeconfig)
        from kubernetes_asyncio import client, config
    except ImportError:
        raise NoCluster(
            "reading a kubeconfig needs the controller's extra: pip install 'drain-router[controller]'"
        ) from None

    configuration = client.Configuration()
    if isinstance(found, InCluster):
        configuration.host = found.server
        configuration.ssl_ca_cert = str(found.ca_path)
        configuration.api_key["BearerToken"] = "Bearer " + found.token()

        def reread(c: Any, *_: Any) -> None:
            c.api_key["BearerToken"] = "Bearer " + found.token()

        configuration.refresh_api_key_hook = reread
        return configuration
    import yaml  # (kubernetes_asyncio's dependency)

    try:
        await config.load_kube_config(
            config_file=os.pathsep.join(str(p) for p in found.paths), client_configuration=configuration
        )
    except (config.ConfigException, yaml.YAMLError, OSError, ValueError) as exc:
        detail = " ".join(str(exc).split())
        raise NoCluster(f"not in a cluster ({found.not_in_cluster}) and the kubeconfig is unusable: {detail}") from None
    return configuration


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """What a plain HTTP client needs to call the API server."""

    server: str
    """The base URL, without a trailing slash."""
    ssl: ssl.SSLContext | bool
    """aiohttp's ``ssl``: a context (CA, client certificate), or False (plain HTTP, or
    ``insecure-skip-tls-verify``)."""
    authorization: Callable[[], Awaitable[str | None]] | None = None
    """The ``Authorization`` header's value, asked for each call (a rotated or refreshed token)."""


async def access(found: InCluster | Kubeconfig) -> Access:
    """The server, TLS and credentials of ``found`` (a kubeconfig's through :func:`client_configuration`,
    so its exec and auth-provider tokens are refreshed as the controller's are)."""
    if isinstance(found, InCluster):

        async def service_account() -> str:
            return "Bearer " + found.token()

        context = ssl.create_default_context(cafile=str(found.ca_path))
        return Access(server=found.server, ssl=context, authorization=service_account)
    configuration = await client_configuration(found)
    server = str(configuration.host).rstrip("/")
    tls: ssl.SSLContext | bool = False
    if server.startswith("https:") and configuration.verify_ssl:
        tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            tls.load_cert_chain(configuration.cert_file, configuration.key_file)

    async def from_kubeconfig() -> str | None:
        # (a bearer token, or basic auth's "Basic ..."; the refresh hook runs first: exec, oidc)
        settings = await configuration.auth_settings()
        return str(settings["BearerToken"]["value"]) if "BearerToken" in settings else None

    return Access(server=server, ssl=tls, authorization=from_kubeconfig)


async def given_or_found(kube_api: str | None) -> Access:
    """``--kube-api URL`` (a stand-in, called without credentials), else :func:`locate`'s; raises
    :class:`NoCluster` when there is neither."""
    if kube_api is not None:
        return Access(server=kube_api, ssl=False)
    return await access(locate())
