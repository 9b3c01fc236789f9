"""The few Kubernetes API calls the controller makes, over one ``kubernetes_asyncio`` ApiClient.

Objects named by ``apiVersion``/``kind`` (the route, the workload) are resolved to their URL through
API discovery, cached per group version, so any kind works (Deployment, Service, HTTPRoute, ...).
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from router.controller import crd
from router.decisions import deletion

MERGE_PATCH = "application/merge-patch+json"


class DiscoveryError(LookupError):
    """A kind that the API server does not serve (CRD not installed, typo in ``spec.workload``)."""


class Kube:
    """Thin async wrapper; every method returns plain dicts, ``None`` for NotFound."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}

    async def _call(self, path: str, method: str, *, body: Any = None, query: list[tuple[str, str]] | None = None,
                    content_type: str | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        return await self.api.call_api(
            path, method, query_params=query or [], header_params=headers, body=body,
            response_types_map={200: "object", 201: "object", 202: "object"},
            auth_settings=["BearerToken"], _return_http_data_only=True)

    async def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._plurals:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = await self._call(base, "GET")
            for item in listing.get("resources", []):
                if "/" not in item["name"]:
                    self._plurals[(api_version, item["kind"])] = (item["name"], bool(item.get("namespaced")))
            if key not in self._plurals:
                raise DiscoveryError(f"{api_version} {kind} is not served by the API server")
        return self._plurals[key]

    async def _path(self, ref: deletion.ObjectRef, namespace: str) -> str:
        plural, namespaced = await self._resource(ref.api_version, ref.kind)
        base = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
        scope = f"/namespaces/{namespace}" if namespaced else ""
        return f"{base}{scope}/{plural}/{ref.name}"

    async def get(self, ref: deletion.ObjectRef, namespace: str) -> dict[str, Any] | None:
        try:
            return await self._call(await self._path(ref, namespace), "GET")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, ref: deletion.ObjectRef, namespace: str) -> int:
        """Background propagation, like ``kubectl delete``: dependents (ReplicaSets, pods) are
        garbage-collected after the owner goes. Returns the HTTP status (404 counts as done)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        return await self._delete(await self._path(ref, namespace), body)

    async def force_delete_pod(self, namespace: str, name: str, uid: str) -> int:
        """Grace 0 with a UID precondition: a replacement pod that reuses the name answers 409."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}
        return await self._delete(f"/api/v1/namespaces/{namespace}/pods/{name}", body)

    async def _delete(self, path: str, body: dict[str, Any]) -> int:
        try:
            await self._call(path, "DELETE", body=body)
            return 200
        except ApiException as exc:
            if exc.status in (404, 409):
                return int(exc.status)
            raise

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        listing = await self._call(f"/api/v1/namespaces/{namespace}/pods", "GET",
                                   query=[("labelSelector", label_selector)])
        return list(listing.get("items") or [])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(f"/api/v1/nodes/{name}", "GET")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _modelservice_path(self, namespace: str, name: str) -> str:
        return f"/apis/{crd.group()}/{crd.version()}/namespaces/{namespace}/{crd.plural()}/{name}"

    async def get_modelservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(self._modelservice_path(namespace, name), "GET")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_modelservice_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._call(self._modelservice_path(namespace, name) + "/status", "PATCH",
                         body={"status": status}, content_type=MERGE_PATCH)
