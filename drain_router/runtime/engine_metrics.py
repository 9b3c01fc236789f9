"""``GET /engine/metrics`` on the admin listener: the model server's own metrics, relayed uncounted.

A scrape of the engine's metrics through the traffic port is a proxied request: it counts in
``served`` and ``requests_total`` and restarts the idle clock, so a pod scraped every 15 s is never
idle and neither recycling nor scale-to-zero acts on it. This handler fetches
``--engine-metrics-path`` from the same upstream address the traffic path uses (TCP or a Unix
socket, as the upstream health check does) and relays the body and its ``Content-Type`` as they
are, touching none of the router's counts.

Bounds, each a named constant, each answered with a static JSON body (the log has the details):

- **size**: a body past :data:`MAX_ENGINE_METRICS_BYTES` is 502 ``engine_metrics_too_large``;
- **time**: no whole answer within :data:`ENGINE_METRICS_TIMEOUT_SECS` is 504 ``engine_metrics_timeout``;
- **concurrency**: one fetch at a time per router. A scrape arriving while a fetch runs shares its
  answer (so it waits at most the same timeout); a caller that leaves does not cancel the fetch
  the others wait for.
- **sending**: the body is held once, as the chunks it was read in, and written to each scraper
  chunk by chunk, each write waiting for the connection's buffer to drain: what one answer adds to a
  connection is bounded by the admin listener's write high-water mark plus one chunk, never a copy
  of the body, and a scraper that stops reading is cut after the admin listener's send timeout
  (:mod:`drain_router.runtime.admin_listener`). Bodies still being sent (a new fetch's answer while
  slow scrapers read an older one) count against :data:`ENGINE_METRICS_HELD_BYTES`; a fetch that
  could pass it is not started: 503 ``engine_metrics_busy``.

The fetch never follows a redirect (no request makes the router connect anywhere but
``--upstream``), asks for the Prometheus text format, and any other answer than 200 is 502
``engine_metrics_unavailable``. ``--engine-metrics-path`` empty: 404 ``engine_metrics_disabled``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
from aiohttp import hdrs, web

from drain_router import config, logs
from drain_router.http1.answers import error_body

log = logs.get("drain_router.engine_metrics")

#: The largest engine metrics body relayed. vLLM's /metrics is tens of KiB (a few hundred KiB with
#: many LoRA adapters or models); 8 MiB is far above any real engine and still bounds the memory a
#: broken or hostile upstream can make the router hold (one fetch at a time).
MAX_ENGINE_METRICS_BYTES = 8 * 1024 * 1024

#: The bodies held at once, the one being fetched and those still being sent to scrapers: two of the
#: largest. A real engine's body, tens of KiB, would need hundreds of scrapers reading at once to
#: reach it; clients that never read cannot hold more than this for longer than the send timeout.
ENGINE_METRICS_HELD_BYTES = 2 * MAX_ENGINE_METRICS_BYTES

#: The size of the chunks a body is read and written in.
CHUNK_BYTES = 64 * 1024

#: The whole fetch (connect, head and body) must finish within this long; Prometheus's default
#: scrape timeout is 10 s, so the scraper gets the router's 504 rather than its own timeout.
ENGINE_METRICS_TIMEOUT_SECS = 5.0

#: What the fetch asks for: the Prometheus text format, which every engine's client library serves.
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"

DISABLED = (404, "engine_metrics_disabled", "the engine's metrics are not relayed: --engine-metrics-path is empty")
TOO_LARGE = (
    502,
    "engine_metrics_too_large",
    f"the model server's metrics are larger than {MAX_ENGINE_METRICS_BYTES} bytes",
)
TIMEOUT = (
    504,
    "engine_metrics_timeout",
    f"the model server did not answer its metrics within {ENGINE_METRICS_TIMEOUT_SECS:g} s",
)
UNAVAILABLE = (502, "engine_metrics_unavailable", "the model server's metrics could not be fetched")
BUSY = (
    503,
    "engine_metrics_busy",
    "earlier answers of the model server's metrics are still being sent to clients that read slowly; retry",
)


@dataclasses.dataclass(slots=True)
class Answer:
    """One fetch's result: the engine's body (the chunks it was read in) and Content-Type, or a static
    error; ``senders``: the scrapes writing it now."""

    chunks: tuple[bytes, ...] = ()
    size: int = 0
    content_type: str | None = None
    error: tuple[int, str, str] | None = None
    senders: int = 0


class EngineMetrics:
    """The relay: a session of its own (one connection to the upstream) and the fetch in progress."""

    def __init__(self, cfg: config.Config) -> None:
        self.path = cfg.admin.engine_metrics_path
        self.upstream = cfg.proxy.upstream
        self.connect_timeout = float(cfg.proxy.upstream_connect_timeout_secs)
        self._session: aiohttp.ClientSession | None = None
        self._fetch: asyncio.Task[Answer] | None = None
        self.sending_bytes = 0
        """The bytes of the bodies being sent (each counted once, however many scrapes send it)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.path is None:
            return _error(DISABLED)
        if self._fetch is None or self._fetch.done():
            if self.sending_bytes + MAX_ENGINE_METRICS_BYTES > ENGINE_METRICS_HELD_BYTES:
                log.warning("engine_metrics.busy", sending_bytes=self.sending_bytes)
                return _error(BUSY)
            self._fetch = asyncio.ensure_future(self._fetch_once())
            self._fetch.add_done_callback(self._fetched)
        answer = await asyncio.shield(self._fetch)  # a caller that leaves does not cancel the others' fetch
        if answer.error is not None:
            return _error(answer.error)
        return await self.send(request, answer)

    def _fetched(self, task: asyncio.Task[Answer]) -> None:
        """A finished fetch's answer lives as long as its scrapes send it, not until the next fetch."""
        if self._fetch is task:
            self._fetch = None

    async def send(self, request: web.Request, answer: Answer) -> web.StreamResponse:
        """Write ``answer`` chunk by chunk, each write waiting while the connection's buffer is above its
        high-water mark (the admin listener cuts a client that stops reading)."""
        response = web.StreamResponse()
        response.content_length = answer.size
        if answer.content_type is not None:
            response.headers[hdrs.CONTENT_TYPE] = answer.content_type
        if answer.senders == 0:
            self.sending_bytes += answer.size
        answer.senders += 1
        try:
            await response.prepare(request)
            for chunk in answer.chunks:
                await response.write(chunk)
            await response.write_eof()
        finally:
            answer.senders -= 1
            if answer.senders == 0:
                self.sending_bytes -= answer.size
        return response

    async def _fetch_once(self) -> Answer:
        assert self.path is not None
        url = self.upstream.base_url + self.path
        timeout = aiohttp.ClientTimeout(total=ENGINE_METRICS_TIMEOUT_SECS, sock_connect=self.connect_timeout)
        try:
            async with self.session().get(
                url, timeout=timeout, allow_redirects=False, headers={hdrs.ACCEPT: ACCEPT}
            ) as resp:
                if resp.status != 200:
                    log.warning("engine_metrics.status", url=url, status=resp.status)
                    return Answer(error=UNAVAILABLE)
                if (resp.content_length or 0) > MAX_ENGINE_METRICS_BYTES:
                    log.warning("engine_metrics.too_large", url=url, content_length=resp.content_length)
                    return Answer(error=TOO_LARGE)
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_ENGINE_METRICS_BYTES:
                        log.warning("engine_metrics.too_large", url=url, read=size)
                        return Answer(error=TOO_LARGE)
                return Answer(chunks=tuple(chunks), size=size, content_type=resp.headers.get(hdrs.CONTENT_TYPE))
        except TimeoutError:
            log.warning("engine_metrics.timeout", url=url, timeout_secs=ENGINE_METRICS_TIMEOUT_SECS)
            return Answer(error=TIMEOUT)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("engine_metrics.failed", url=url, error=repr(exc))
            return Answer(error=UNAVAILABLE)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector: aiohttp.BaseConnector
            if self.upstream.unix_path is not None:
                connector = aiohttp.UnixConnector(path=self.upstream.unix_path, limit=1)
            else:
                connector = aiohttp.TCPConnector(limit=1)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def close(self, app: web.Application | None = None) -> None:
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()
        if self._session is not None:
            await self._session.close()


def _error(error: tuple[int, str, str]) -> web.Response:
    status, kind, message = error
    return web.Response(status=status, body=error_body(status, kind, message), content_type="application/json")


def install(app: web.Application, cfg: config.Config) -> None:
    """Route ``GET /engine/metrics`` of the admin app to a relay closed with the app."""
    relay = EngineMetrics(cfg)
    app.router.add_get("/engine/metrics", relay.handle)
    app.on_cleanup.append(relay.close)
