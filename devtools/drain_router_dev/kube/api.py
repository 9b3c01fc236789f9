"""A small client of the Kubernetes API as one identity of a kubeconfig (a client certificate, or a
bearer token): what the node agent and the end-to-end scenarios need, with the answers as JSON."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

Json = dict[str, Any]


class ApiError(RuntimeError):
    """An answer of 300 or more the caller did not expect: ``status`` and the Status ``body``."""

    def __init__(self, method: str, path: str, status: int, body: Json) -> None:
        super().__init__(f"{method} {path}: {status} {body.get('message', body)}")
        self.status = status
        self.body = body


class Api:
    """Requests as the kubeconfig's user (its client certificate), or as the bearer of ``token``."""

    def __init__(self, kubeconfig: Path, *, token: str | None = None, keep_alive: bool = True) -> None:
        """``keep_alive=False``: a connection per request, closed with its answer (a test's client:
        nothing is left open when its event loop ends)."""
        config = json.loads(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = cluster["server"].rstrip("/")
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.headers: dict[str, str] = {}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        else:
            self.ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, force_close=not keep_alive))

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
    ) -> tuple[int, Json]:
        async with self.session.request(
            method, self.server + path, data=None if body is None else json.dumps(body),
            headers={**self.headers, "Content-Type": content_type}, timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:  # fmt: skip
            payload = await resp.json(content_type=None) if resp.content_length != 0 else {}
            if resp.status >= 300 and resp.status not in ok:
                raise ApiError(method, path, resp.status, payload if isinstance(payload, dict) else {})
            return resp.status, payload or {}

    async def patch_status(self, pod: Json, status: Json) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        await self.request("PATCH", path, {"metadata": {"uid": meta["uid"]}, "status": status},
                           content_type="application/strategic-merge-patch+json", ok=(404, 409))  # fmt: skip

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[Json]:
        """The events of a watch on ``path`` (a collection, with its query) from ``resource_version``."""
        joiner = "&" if "?" in path else "?"
        url = f"{self.server}{path}{joiner}watch=true&allowWatchBookmarks=true&resourceVersion={resource_version}"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=400)
        async with self.session.get(url, headers=self.headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise ApiError("WATCH", path, resp.status, {})
            async for line in resp.content:
                yield json.loads(line)
