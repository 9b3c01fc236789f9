"""The few Kubernetes API calls the controller makes, over one ``kubernetes_asyncio`` ApiClient.

Objects named by ``apiVersion``/``kind`` (the route, the workload) are resolved to their URL through
kubernetes_asyncio's own API discovery (its ``DynamicClient`` with the lazy discoverer: ``/version``
and ``/apis`` once, then one group version's resource list when first asked for; a kind it does not
find makes it discover again, so a CRD installed later is found), so any kind works (Deployment,
Service, HTTPRoute, ...). Its cache stays in memory: the library's file cache (a file per API server
host in the temp directory, shared between processes and kept across restarts) is not used.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic import discovery as dynamic_discovery
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError

from drain_router.controller import crd
from drain_router.decisions import deletion, recycling

MERGE_PATCH = "application/merge-patch+json"


class DiscoveryError(LookupError):
    """A kind that the API server does not serve (CRD not installed, typo in ``spec.workload``)."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class CallFailed(Exception):
    """An API call that failed, as data the decisions can read (``failure``)."""

    def __init__(self, failure: deletion.ApiFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


#: What a call can fail with: an error answer, a kind not served, no answer at all.
_FAILURES = (ApiException, DiscoveryError, aiohttp.ClientError, asyncio.TimeoutError)


def failure(call: str, exc: BaseException) -> deletion.ApiFailure:
    """An exception from one of :data:`_FAILURES` -> the failure, with the API server's ``Status``
    message when the answer carried one."""
    if isinstance(exc, DiscoveryError):
        return deletion.ApiFailure(call=call, code=exc.code, message=exc.message)
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        try:
            message = json.loads(exc.body or "{}").get("message") or message
        except (ValueError, AttributeError):
            pass
        return deletion.ApiFailure(call=call, code=exc.status, message=message)
    return deletion.ApiFailure(call=call, code=None, message=f"no answer ({type(exc).__name__}: {exc})")


def guess_plural(kind: str) -> str:
    """The resource name kubectl would guess for a kind (``HTTPRoute`` -> ``httproutes``), used only
    to name a call when discovery itself failed."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y") and lower[-2:-1] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"


#: A cache file that is never there: the discoverer then starts from the API server.
_NO_CACHE_FILE = "/nonexistent/drain-router-discovery.json"


class _MemoryDiscoverer(dynamic_discovery.LazyDiscoverer):
    """The library's lazy discoverer with its cache in memory only (never written to a file)."""

    def _write_cache(self) -> None:
        pass


class Kube:
    """Thin async wrapper; every method returns plain dicts, ``None`` for NotFound."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}
        self._dynamic: DynamicClient | None = None
        self._discovering = asyncio.Lock()

    async def _call(
        self,
        path: str,
        method: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        return await self.api.call_api(
            path,
            method,
            query_params=query or [],
            header_params=headers,
            body=body,
            response_types_map={200: "object", 201: "object", 202: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )

    async def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of a kind, from the library's discovery. A kind or group version the
        API server does not serve is :class:`DiscoveryError` 404; a failed discovery call is
        :class:`DiscoveryError` with its status."""
        key = (api_version, kind)
        if key not in self._plurals:
            try:
                async with self._discovering:  # one discovery at a time: its cache is shared state
                    if self._dynamic is None:
                        self._dynamic = await DynamicClient(
                            self.api, cache_file=_NO_CACHE_FILE, discoverer=_MemoryDiscoverer
                        )
                    found = await self._dynamic.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                raise DiscoveryError(404, f"{kind} is not served in {api_version} by the API server") from None
            except ApiException as exc:
                raise DiscoveryError(
                    exc.status, f"API discovery failed for {api_version} {kind}: {exc.status} {exc.reason}"
                ) from None
            self._plurals[key] = (str(found.name), bool(found.namespaced))
        return self._plurals[key]

    async def _path(self, ref: deletion.ObjectRef, namespace: str) -> str:
        plural, namespaced = await self._resource(ref.api_version, ref.kind)
        base = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
        scope = f"/namespaces/{namespace}" if namespaced else ""
        return f"{base}{scope}/{plural}/{ref.name}"

    def _name(self, verb: str, ref: deletion.ObjectRef) -> str:
        """``GET gateway.networking.k8s.io/v1 httproutes/llama``: the call as an operator looks it up."""
        known = self._plurals.get((ref.api_version, ref.kind))
        return f"{verb} {ref.api_version} {known[0] if known else guess_plural(ref.kind)}/{ref.name}"

    async def get(self, ref: deletion.ObjectRef, namespace: str) -> dict[str, Any] | None:
        """The object, ``None`` for NotFound; :class:`CallFailed` for any other failure."""
        try:
            return await self._call(await self._path(ref, namespace), "GET")
        except _FAILURES as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            raise CallFailed(failure(self._name("GET", ref), exc)) from exc

    async def delete(self, ref: deletion.ObjectRef, namespace: str) -> int:
        """Background propagation, like ``kubectl delete``: dependents (ReplicaSets, pods) are
        garbage-collected after the owner goes. Returns the HTTP status (404 counts as done);
        :class:`CallFailed` for a refusal (403, 500) or no answer."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            return await self._delete(await self._path(ref, namespace), body)
        except _FAILURES as exc:
            raise CallFailed(failure(self._name("DELETE", ref), exc)) from exc

    async def force_delete_pod(self, namespace: str, name: str, uid: str) -> int:
        """Grace 0 with a UID precondition: a replacement pod that reuses the name answers 409."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            return await self._delete(f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except _FAILURES as exc:
            raise CallFailed(failure(f"DELETE v1 pods/{name} (grace 0)", exc)) from exc

    async def _delete(self, path: str, body: dict[str, Any]) -> int:
        try:
            await self._call(path, "DELETE", body=body)
            return 200
        except ApiException as exc:
            if exc.status in (404, 409):
                return int(exc.status)
            raise

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        try:
            listing = await self._call(
                f"/api/v1/namespaces/{namespace}/pods", "GET", query=[("labelSelector", label_selector)]
            )
        except _FAILURES as exc:
            raise CallFailed(failure(f"LIST v1 pods labelSelector={label_selector}", exc)) from exc
        return list(listing.get("items") or [])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(f"/api/v1/nodes/{name}", "GET")
        except _FAILURES as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            raise CallFailed(failure(f"GET v1 nodes/{name}", exc)) from exc

    def _modelservice_path(self, namespace: str, name: str) -> str:
        return f"/apis/{crd.group()}/{crd.version()}/namespaces/{namespace}/{crd.plural()}/{name}"

    async def get_modelservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(self._modelservice_path(namespace, name), "GET")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_modelservice_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch ``status``. With ``resource_version`` the patch is conditional: the API server
        answers 409 (:class:`Conflict`) when the object changed since it was read."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            answer = await self._call(
                self._modelservice_path(namespace, name) + "/status", "PATCH", body=body, content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(failure(f"PATCH {crd.plural()}/{name}/status", exc)) from exc
            raise
        return dict(answer or {})

    async def delete_modelservice(self, namespace: str, name: str) -> int:
        """Delete the ModelService (its finalizer then runs the staged teardown). 404 counts as done."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            return await self._delete(self._modelservice_path(namespace, name), body)
        except _FAILURES as exc:
            raise CallFailed(failure(f"DELETE {crd.group()}/{crd.version()} {crd.plural()}/{name}", exc)) from exc

    async def scale(self, ref: deletion.ObjectRef, namespace: str, replicas: int) -> None:
        """Merge patch of ``spec.replicas`` (the Deployment's own resource: no scale subresource, so the
        RBAC is one ``patch`` on deployments)."""
        try:
            await self._call(
                await self._path(ref, namespace),
                "PATCH",
                body={"spec": {"replicas": replicas}},
                content_type=MERGE_PATCH,
            )
        except _FAILURES as exc:
            raise CallFailed(failure(self._name("PATCH", ref) + f" spec.replicas={replicas}", exc)) from exc

    async def evict_pod(self, namespace: str, name: str, uid: str) -> recycling.EvictAnswer:
        """``policy/v1`` Eviction with a UID precondition and the pod's own grace (no
        ``gracePeriodSeconds``). Every answer is data, never an exception: the code, the Status
        reason, the first cause's reason and the message. A 2xx whose body says ``status: Failure``
        is a failure; no answer at all is code 0."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        try:
            answer = await self._call(f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", "POST", body=body)
        except ApiException as exc:
            return evict_answer(int(exc.status or 0), _json(exc.body))
        except (TimeoutError, aiohttp.ClientError) as exc:
            return recycling.EvictAnswer(code=0, message=f"no answer ({type(exc).__name__}: {exc})")
        return evict_answer(201, answer if isinstance(answer, dict) else {})


class Conflict(CallFailed):
    """409 on a conditional write: the object changed since it was read."""


def _json(text: Any) -> dict[str, Any]:
    try:
        data = json.loads(text or "{}")
    except (ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def evict_answer(code: int, body: dict[str, Any]) -> recycling.EvictAnswer:
    """An Eviction answer -> data. A ``Status`` body with ``status: Failure`` is a failure whatever the
    code (the code is then the body's own, when it has one)."""
    failure_body = body.get("kind") == "Status" and body.get("status") == "Failure"
    causes = (body.get("details") or {}).get("causes") or ()
    cause = causes[0].get("reason") if causes and isinstance(causes[0], dict) else None
    return recycling.EvictAnswer(
        code=code,
        reason=body.get("reason") or None,
        cause=cause,
        message=str(body.get("message") or ""),
        failure=failure_body and 200 <= code < 300,
    )
