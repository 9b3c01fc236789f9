"""The activator's few calls, over plain aiohttp: the Kubernetes API (read the port map's ConfigMap,
read a ModelService, patch its status, list its pods) and the pods' routers (``/readyz`` on their traffic port). Answers are data:
a status code and a JSON body, for :mod:`.waking` to act on; a call that gets no answer raises
:class:`Unanswered`.

The API server and the credentials are :mod:`drain_router.kubelogin`'s, the controller's rule: the
pod's service account in a cluster (its token read again for each call: the kubelet rotates it),
else ``KUBECONFIG`` or ``~/.kube/config``; ``--kube-api URL`` points elsewhere (a test's stand-in),
with no credentials.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import aiohttp

from drain_router import kubelogin

GROUP_VERSION = "drainrouter.dev/v1alpha1"

#: One API call, or one probe of a pod's router, may take this long before it counts as unanswered
#: (the next poll tries again).
CALL_TIMEOUT_SECS = 5.0
PROBE_TIMEOUT_SECS = 1.0


def own_namespace() -> str | None:
    """The pod's namespace, from its service account (None out of cluster)."""
    try:
        return (kubelogin.SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError:
        return None


class Unanswered(Exception):
    """No answer (connection refused, a timeout, a reset): the caller tries again at its next poll."""


class Kube:
    """The API server and the pods' routers, from one session."""

    def __init__(self, api: kubelogin.Access) -> None:
        self.api = api.server.rstrip("/")
        self.authorization = api.authorization
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=api.ssl, limit=64),
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECS),
        )

    async def close(self) -> None:
        await self.session.close()

    async def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if self.authorization is not None:
            value = await self.authorization()
            if value:
                headers["Authorization"] = value
        return headers

    async def _call(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        try:
            headers = await self._headers(content_type)
            async with self.session.request(method, self.api + path, data=data, headers=headers) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unanswered(f"{method} {path}: {exc!r}") from None
        try:
            return resp.status, json.loads(text) if text else None
        except ValueError:
            return resp.status, None

    @staticmethod
    def modelservice_path(namespace: str, name: str) -> str:
        return f"/apis/{GROUP_VERSION}/namespaces/{namespace}/modelservices/{name}"

    async def get_configmap(self, namespace: str, name: str) -> tuple[int, Any]:
        return await self._call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    async def get_modelservice(self, namespace: str, name: str) -> tuple[int, Any]:
        return await self._call("GET", self.modelservice_path(namespace, name))

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> tuple[int, Any]:
        """A merge patch of the status subresource (a 409: the resourceVersion it carried is stale)."""
        path = self.modelservice_path(namespace, name) + "/status"
        return await self._call("PATCH", path, patch, "application/merge-patch+json")

    async def list_pods(self, namespace: str, selector: str) -> tuple[int, Any]:
        query = urllib.parse.quote(selector, safe="=,!")
        return await self._call("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={query}")

    async def list_endpointslices(self, namespace: str, service: str) -> tuple[int, Any]:
        """The EndpointSlices of the Service ``service`` (its ``kubernetes.io/service-name`` label)."""
        query = urllib.parse.quote(f"kubernetes.io/service-name={service}", safe="=")
        return await self._call(
            "GET", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={query}"
        )

    async def router_ready(self, ip: str, port: int) -> bool:
        """The pod's router answers ``/readyz`` on its traffic port 200 (anything else, or no answer:
        not ready)."""
        host = f"[{ip}]" if ":" in ip else ip
        try:
            async with self.session.get(
                f"http://{host}:{port}/readyz", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECS)
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
