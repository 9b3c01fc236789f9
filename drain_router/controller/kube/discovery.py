"""Where an object named by ``apiVersion``/``kind`` lives: its resource name and scope.

The route and the workload may be any kind (Deployment, Service, HTTPRoute, ...), so their URLs come
from kubernetes_asyncio's own API discovery (its ``DynamicClient`` with the lazy discoverer:
``/version`` and ``/apis`` once, then one group version's resource list when first asked for; a kind
it does not find makes it discover again, so a CRD installed later is found). Its cache stays in
memory: the library's file cache (a file per API server host in the temp directory, shared between
processes and kept across restarts) is not used.
"""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic import discovery as dynamic_discovery
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError

from drain_router.decisions import deletion


class DiscoveryError(LookupError):
    """A kind that the API server does not serve (CRD not installed, typo in ``spec.workload``)."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


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


class Discovery:
    """``(apiVersion, kind)`` -> ``(plural, namespaced)``, discovered once per kind and remembered."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}
        self._dynamic: DynamicClient | None = None
        self._discovering = asyncio.Lock()

    async def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
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

    async def path(self, ref: deletion.ObjectRef, namespace: str) -> str:
        """The object's URL path on the API server."""
        plural, namespaced = await self.resource(ref.api_version, ref.kind)
        base = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
        scope = f"/namespaces/{namespace}" if namespaced else ""
        return f"{base}{scope}/{plural}/{ref.name}"

    def call_name(self, verb: str, ref: deletion.ObjectRef) -> str:
        """``GET gateway.networking.k8s.io/v1 httproutes/llama``: the call as an operator looks it up
        (the plural guessed when discovery has not found it)."""
        known = self._plurals.get((ref.api_version, ref.kind))
        return f"{verb} {ref.api_version} {known[0] if known else guess_plural(ref.kind)}/{ref.name}"
