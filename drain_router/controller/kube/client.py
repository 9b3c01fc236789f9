"""The few Kubernetes API calls the controller makes, over one ``kubernetes_asyncio`` ApiClient.

Objects named by ``apiVersion``/``kind`` (the route, the workload) are resolved to their URL by
:mod:`drain_router.controller.kube.discovery`, so any kind works. Every answer is a plain dict, ``None``
for NotFound; a failure is :class:`CallFailed`, which names the call.

Every write to an object of the user's (delete, force delete, eviction, scale, patch) takes an
:class:`ownership.Consent` and writes only the object it names, in its namespace, with its ``uid`` as
a precondition (and a route patch on the ``resourceVersion`` it was read at): the ownership rule of :mod:`drain_router.decisions.ownership` is checked before any call reaches here.
The ModelService's own status, events, the controller's Lease, the activator's port map and the
NetworkPolicies it writes in the activator's namespace are the controller's own objects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from drain_router.controller import crd
from drain_router.controller.kube import discovery
from drain_router.decisions import deletion, ownership, recycling

MERGE_PATCH = "application/merge-patch+json"

FOREGROUND_KINDS = frozenset({("apps", "Deployment"), ("apps", "ReplicaSet"), ("apps", "StatefulSet")})
"""Kinds deleted with ``propagationPolicy: Foreground``: the object stays (terminating) until its
pods are gone, so a terminating pod can still prove it is the service's through its owners while the
teardown waits for it (and force-deletes it); everything else goes in the background."""


def _named(ref: deletion.ObjectRef, consent: ownership.Consent) -> None:
    if (ref.kind, ref.name) != (consent.kind, consent.name):
        raise ValueError(f"consent for {consent.kind}/{consent.name} used to write {ref}")


class CallFailed(Exception):
    """An API call that failed, as data the decisions can read (``failure``)."""

    def __init__(self, failure: deletion.ApiFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


#: What a call can fail with: an error answer, a kind not served, no answer at all.
FAILURES = (ApiException, discovery.DiscoveryError, aiohttp.ClientError, asyncio.TimeoutError)
"""What an API call raises when it gets no answer or an error one."""


def failure(call: str, exc: BaseException) -> deletion.ApiFailure:
    """An exception from one of :data:`FAILURES` -> the failure, with the API server's ``Status``
    message when the answer carried one."""
    if isinstance(exc, discovery.DiscoveryError):
        return deletion.ApiFailure(call=call, code=exc.code, message=exc.message)
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        try:
            message = json.loads(exc.body or "{}").get("message") or message
        except (ValueError, AttributeError):
            pass
        return deletion.ApiFailure(call=call, code=exc.status, message=message)
    return deletion.ApiFailure(call=call, code=None, message=f"no answer ({type(exc).__name__}: {exc})")


class Kube:
    """Thin async wrapper; every method returns plain dicts, ``None`` for NotFound."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._discovery = discovery.Discovery(api)

    async def _call(
        self,
        path: str,
        method: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> object:
        """The answer's JSON value as the untyped client decoded it: :func:`_as_object` types it."""
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

    async def get(self, ref: deletion.ObjectRef, namespace: str) -> dict[str, Any] | None:
        """The object, ``None`` for NotFound; :class:`CallFailed` for any other failure."""
        try:
            return _as_object(await self._call(await self._discovery.path(ref, namespace), "GET"))
        except FAILURES as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            raise CallFailed(failure(self._discovery.call_name("GET", ref), exc)) from exc

    async def delete(self, ref: deletion.ObjectRef, consent: ownership.Consent) -> int:
        """Delete the object ``consent`` proves the service's, with its uid as a precondition (409
        when a replacement took the name since it was read: decided again on the next pass).
        Background propagation, like ``kubectl delete``, except for the kinds of
        :data:`FOREGROUND_KINDS`. Returns the HTTP status (404 and 409 count as answered);
        :class:`CallFailed` for a refusal (403, 500) or no answer."""
        _named(ref, consent)
        policy = "Foreground" if (ref.group, ref.kind) in FOREGROUND_KINDS else "Background"
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": policy,
            "preconditions": {"uid": consent.uid},
        }
        try:
            return await self._delete(await self._discovery.path(ref, consent.namespace), body)
        except FAILURES as exc:
            raise CallFailed(failure(self._discovery.call_name("DELETE", ref), exc)) from exc

    async def force_delete_pod(self, consent: ownership.Consent) -> int:
        """Grace 0 with a UID precondition: a replacement pod that reuses the name answers 409."""
        if consent.kind != "Pod":
            raise ValueError(f"consent for {consent.kind}/{consent.name} used to force-delete a pod")
        grace = {"gracePeriodSeconds": 0, "preconditions": {"uid": consent.uid}}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **grace}
        try:
            return await self._delete(f"/api/v1/namespaces/{consent.namespace}/pods/{consent.name}", body)
        except FAILURES as exc:
            raise CallFailed(failure(f"DELETE v1 pods/{consent.name} (grace 0)", exc)) from exc

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
            listing = _as_object(
                await self._call(
                    f"/api/v1/namespaces/{namespace}/pods", "GET", query=[("labelSelector", label_selector)]
                )
            )
        except FAILURES as exc:
            raise CallFailed(failure(f"LIST v1 pods labelSelector={label_selector}", exc)) from exc
        return list((listing or {}).get("items") or [])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return _as_object(await self._call(f"/api/v1/nodes/{name}", "GET"))
        except FAILURES as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            raise CallFailed(failure(f"GET v1 nodes/{name}", exc)) from exc

    def _modelservice_path(self, namespace: str, name: str) -> str:
        return f"/apis/{crd.group()}/{crd.version()}/namespaces/{namespace}/{crd.plural()}/{name}"

    async def get_modelservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _as_object(await self._call(self._modelservice_path(namespace, name), "GET"))
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
        return dict(_as_object(answer) or {})

    async def delete_modelservice(self, consent: ownership.Consent) -> int:
        """Delete the ModelService (its finalizer then runs the staged teardown). 404 counts as done."""
        if consent.how is not ownership.How.ITSELF:
            raise ValueError(f"consent for {consent.kind}/{consent.name} used to delete a ModelService")
        namespace, name = consent.namespace, consent.name
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": consent.uid},
        }
        try:
            return await self._delete(self._modelservice_path(namespace, name), body)
        except FAILURES as exc:
            raise CallFailed(failure(f"DELETE {crd.group()}/{crd.version()} {crd.plural()}/{name}", exc)) from exc

    async def scale(self, ref: deletion.ObjectRef, consent: ownership.Consent, replicas: int) -> None:
        """Merge patch of ``spec.replicas`` (the Deployment's own resource: no scale subresource, so the
        RBAC is one ``patch`` on deployments). The patch carries the object's uid, which is
        immutable: a replacement under the same name answers 422 and is not scaled. Not its
        resourceVersion: a Deployment's status moves with its pods, and a wake must not wait a pass
        for every status write."""
        _named(ref, consent)
        body: dict[str, Any] = {"metadata": {"uid": consent.uid}, "spec": {"replicas": replicas}}
        try:
            await self._call(
                await self._discovery.path(ref, consent.namespace), "PATCH", body=body, content_type=MERGE_PATCH
            )
        except FAILURES as exc:
            raise CallFailed(
                failure(self._discovery.call_name("PATCH", ref) + f" spec.replicas={replicas}", exc)
            ) from exc

    async def patch(self, ref: deletion.ObjectRef, consent: ownership.Consent, body: dict[str, Any]) -> dict[str, Any]:
        """Merge patch of the object ``consent`` proves the service's (a route switch), conditional on
        the resourceVersion it was read at: :class:`Conflict` when it changed since."""
        _named(ref, consent)
        metadata = {**(body.get("metadata") or {}), "uid": consent.uid}
        if consent.resource_version:
            metadata["resourceVersion"] = consent.resource_version
        body = {**body, "metadata": metadata}
        try:
            answer = await self._call(
                await self._discovery.path(ref, consent.namespace), "PATCH", body=body, content_type=MERGE_PATCH
            )
        except FAILURES as exc:
            raise written(self._discovery.call_name("PATCH", ref), exc) from exc
        return dict(_as_object(answer) or {})

    async def list(
        self, ref: deletion.ObjectRef, namespace: str, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects of ``ref``'s kind in ``namespace`` (``ref.name`` unused), by label selector;
        :class:`CallFailed` for any failure."""
        query = [("labelSelector", label_selector)] if label_selector else []
        try:
            path = (await self._discovery.path(ref, namespace)).rsplit("/", 1)[0]
            listing = _as_object(await self._call(path, "GET", query=query))
        except FAILURES as exc:
            raise CallFailed(
                failure(self._discovery.call_name("LIST", ref) + f" labelSelector={label_selector}", exc)
            ) from exc
        return list((listing or {}).get("items") or [])

    async def create(self, ref: deletion.ObjectRef, consent: ownership.Consent, body: dict[str, Any]) -> dict[str, Any]:
        """Create the object ``consent`` (:func:`ownership.to_create`) names, in the service's
        namespace, only as the service's: labelled for it and with an owner reference to it.
        :class:`Conflict` when it exists already (409)."""
        _named(ref, consent)
        meta = body.get("metadata") or {}
        owners = meta.get("ownerReferences") or ()
        if (
            consent.how is not ownership.How.CREATED
            or meta.get("name") != consent.name
            or meta.get("namespace", consent.namespace) != consent.namespace
            or (meta.get("labels") or {}).get(ownership.SERVICE_LABEL) != consent.service.name
            or not any(o.get("uid") == consent.service.uid and o.get("name") == consent.service.name for o in owners)
        ):
            raise ValueError(f"{ref} would not be labelled for and owned by {consent.service.name}")
        try:
            path = (await self._discovery.path(ref, consent.namespace)).rsplit("/", 1)[0]
            answer = await self._call(path, "POST", body=body)
        except FAILURES as exc:
            raise written(self._discovery.call_name("POST", ref), exc) from exc
        return dict(_as_object(answer) or {})

    # --- the controller's own objects in the activator's namespace: the port map, the policies ------

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _as_object(await self._call(f"/api/v1/namespaces/{namespace}/configmaps/{name}", "GET"))
        except FAILURES as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            raise CallFailed(failure(f"GET v1 configmaps/{name}", exc)) from exc

    async def write_configmap(
        self, namespace: str, name: str, data: dict[str, str | None], resource_version: str | None
    ) -> None:
        """The port map: created with ``data`` when ``resource_version`` is None, else merge-patched
        (``None`` removes a key) on that resourceVersion. :class:`Conflict` when another writer came
        first (409: it exists already, or changed since it was read)."""
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            if resource_version is None:
                body: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace},
                    "data": {k: v for k, v in data.items() if v is not None},
                }
                await self._call(base, "POST", body=body)
            else:
                body = {"metadata": {"resourceVersion": resource_version}, "data": data}
                await self._call(f"{base}/{name}", "PATCH", body=body, content_type=MERGE_PATCH)
        except FAILURES as exc:
            raise written(f"{'POST' if resource_version is None else 'PATCH'} v1 configmaps/{name}", exc) from exc

    async def put_networkpolicy(self, body: dict[str, Any], stored: dict[str, Any] | None) -> None:
        """A policy of the controller's own in the activator's namespace: created, or its spec replaced
        by a merge patch on the resourceVersion read (:class:`Conflict` when it changed since)."""
        meta = body["metadata"]
        base = f"/apis/networking.k8s.io/v1/namespaces/{meta['namespace']}/networkpolicies"
        try:
            if stored is None:
                await self._call(base, "POST", body=body)
            else:
                version = (stored.get("metadata") or {}).get("resourceVersion")
                patch = {"metadata": {"resourceVersion": version, "labels": meta.get("labels")}, "spec": body["spec"]}
                # a merge patch merges nested objects: lists (ingress, from) are replaced whole
                await self._call(f"{base}/{meta['name']}", "PATCH", body=patch, content_type=MERGE_PATCH)
        except FAILURES as exc:
            verb = "POST" if stored is None else "PATCH"
            raise written(f"{verb} networking.k8s.io/v1 networkpolicies/{meta['name']}", exc) from exc

    async def delete_networkpolicy(self, namespace: str, name: str) -> int:
        """Delete a policy of the controller's own (404: already gone)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            return await self._delete(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}", body)
        except FAILURES as exc:
            raise CallFailed(failure(f"DELETE networking.k8s.io/v1 networkpolicies/{name}", exc)) from exc

    async def evict_pod(self, consent: ownership.Consent) -> recycling.EvictAnswer:
        """``policy/v1`` Eviction with a UID precondition and the pod's own grace (no
        ``gracePeriodSeconds``). Every answer is data, never an exception: the code, the Status
        reason, the first cause's reason and the message. A 2xx whose body says ``status: Failure``
        is a failure; no answer at all is code 0."""
        if consent.kind != "Pod":
            raise ValueError(f"consent for {consent.kind}/{consent.name} used to evict a pod")
        namespace, name = consent.namespace, consent.name
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": consent.uid}},
        }
        try:
            answer = await self._call(f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", "POST", body=body)
        except ApiException as exc:
            return evict_answer(int(exc.status or 0), _json(exc.body))
        except (TimeoutError, aiohttp.ClientError) as exc:
            return recycling.EvictAnswer(code=0, message=f"no answer ({type(exc).__name__}: {exc})")
        return evict_answer(201, _as_object(answer) or {})


class Conflict(CallFailed):
    """409 on a conditional write: the object changed since it was read."""


def written(call: str, exc: BaseException) -> CallFailed:
    """What a failed write raises: :class:`Conflict` for a 409, :class:`CallFailed` otherwise."""
    cls = Conflict if isinstance(exc, ApiException) and exc.status == 409 else CallFailed
    return cls(failure(call, exc))


def _as_object(answer: object) -> dict[str, Any] | None:
    """A JSON value -> the object it is, ``None`` when it is none (an empty body). The one place an
    answer of the untyped client becomes typed: every call whose answer we read expects an object."""
    return answer if isinstance(answer, dict) else None


def _json(text: Any) -> dict[str, Any]:
    try:
        data = json.loads(text or "{}")
    except (ValueError, TypeError):
        return {}
    return _as_object(data) or {}


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
