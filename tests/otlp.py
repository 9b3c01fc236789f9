"""A real OTLP/HTTP trace receiver for the tracing tests: an aiohttp server that accepts
``POST /v1/traces``, decodes ``ExportTraceServiceRequest`` with opentelemetry-proto (the wire format
the SDK's exporter writes), and keeps every span with its resource. ``delay`` makes it a slow
collector (each export answered that much later)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

from drain_router_dev import process


def value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


@dataclass
class Span:
    """One exported span, decoded: ids as hex, attributes and event names as plain data."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[str]
    status_code: int
    links: list[tuple[str, str]]
    resource: dict[str, Any]

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"


@dataclass
class Receiver:
    port: int = 0
    spans: list[Span] = field(default_factory=list)
    exports: int = 0
    raw: list[bytes] = field(default_factory=list)
    """Every export request's body as received: what a collector, and whoever reads it, gets."""
    delay: float = 0.0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.delay:
            await asyncio.sleep(self.delay)  # a slow collector is what is under test
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.exports += 1
        self.raw.append(body)
        for rs in message.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes={a.key: value(a.value) for a in s.attributes},
                            events=[e.name for e in s.events],
                            status_code=s.status.code,
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            resource=resource,
                        )
                    )
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def wait_spans(self, n: int, timeout: float = 10.0, **attrs: Any) -> list[Span]:
        """Wait until ``n`` spans (with these attributes, if given) have arrived; returns them."""

        def matching() -> list[Span]:
            return [s for s in self.spans if all(s.attributes.get(k) == v for k, v in attrs.items())]

        return await process.wait_until(matching, timeout, f"{n} spans {attrs}", until=lambda got: len(got) >= n)


@asynccontextmanager
async def running() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.port = runner.addresses[0][1]
    try:
        yield receiver
    finally:
        await runner.cleanup()


def environment(endpoint: str, **extra: str) -> dict[str, str]:
    """This process's environment with the exporter pointed at ``endpoint`` and a short batch delay."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="router-under-test",
    )
    env.update(extra)
    return env
