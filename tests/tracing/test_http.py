"""Spans of proxied HTTP requests (``--tracing``), exported by the real SDK and OTLP/HTTP exporter of
a real router process to a real receiver: one SERVER span per request (none for probes), the client's
trace context continued, the router's span the upstream's parent, sampling, and tracing off."""

from __future__ import annotations

import signal
import socket
import sys

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from drain_router_dev.process import wait_until
from tests import otlp, rawupstream
from tests.process import RouterProcess
from tests.tracing.conftest import StartTraced

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR


async def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def echoed(port: int, headers: dict[str, str]) -> dict[str, str]:
    """The headers /echo's upstream received."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/echo", headers=headers) as resp:
        assert resp.status == 200
        return dict((await resp.json())["headers"])


async def dropped(p: RouterProcess) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{p.admin_port}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "drain_router_tracing_spans_dropped":
            return next(x.value for x in family.samples if x.name.endswith("_total"))
    raise AssertionError("no drain_router_tracing_spans_dropped_total")


async def test_a_span_per_request_continuing_the_client_and_parenting_the_upstream(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """1. a client sends a sampled traceparent and a tracestate 2. the router forwards /echo
    Result: one SERVER span with the client's trace id and its span as parent; the upstream gets one
    traceparent naming the router's span (sampled), the tracestate passed on; probes have no span."""
    p = await start_traced(raw_upstream.url)
    assert (await get(p.port, "/livez"))[0] == 200
    assert (await get(p.port, "/readyz"))[0] == 200
    seen = await echoed(p.port, {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "vendor=opaque"})
    [span] = await receiver.wait_spans(1)
    assert (span.kind, span.trace_id, span.parent_span_id) == (SERVER, TRACE, PARENT)
    assert seen["traceparent"] == f"00-{TRACE}-{span.span_id}-01"
    assert seen["tracestate"] == "vendor=opaque"
    assert span.name == "GET"
    assert span.resource["service.name"] == "router-under-test"
    attrs = span.attributes
    assert attrs["http.request.method"] == "GET"
    assert attrs["url.path"] == "/echo"
    assert attrs["url.scheme"] == "http"
    assert attrs["http.response.status_code"] == 200
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == p.port
    assert attrs["network.protocol.version"] == "1.1"
    assert attrs["client.address"] == "127.0.0.1"
    assert attrs["drain_router.outcome"] == "completed"
    assert attrs["drain_router.response.chunks"] >= 1
    assert attrs["drain_router.response.bytes"] > 100
    assert attrs["drain_router.time_to_first_byte_s"] >= 0  # the loop clock ticks in milliseconds
    assert span.status_code != ERROR
    assert not [s for s in receiver.spans if s.attributes.get("url.path") in ("/livez", "/readyz")]


async def test_a_request_without_trace_context_starts_a_trace_and_errors_are_marked(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """A request with no traceparent gets a root span, and the upstream a traceparent naming it; a
    model server that refuses connections (502, upstream_error) makes the span an error."""
    p = await start_traced(raw_upstream.url)
    seen = await echoed(p.port, {})
    [root] = await receiver.wait_spans(1)
    assert root.parent_span_id == ""
    # Sampled (the SDK may also set W3C level 2's random-trace-id flag on a trace it starts).
    assert seen["traceparent"][:-3] == f"00-{root.trace_id}-{root.span_id}"
    assert int(seen["traceparent"][-2:], 16) & 1
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    q = await start_traced(down)
    assert (await get(q.port, "/v1/models"))[0] == 502
    [failed] = await receiver.wait_spans(1, **{"drain_router.outcome": "upstream_error"})
    assert (failed.status_code, failed.attributes["error.type"]) == (ERROR, "upstream_error")
    assert failed.attributes["http.response.status_code"] == 502


async def test_a_sampled_out_parent_is_honoured(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """Parent-based sampling (the SDK's default): a traceparent with flags 00 exports nothing and
    goes upstream not sampled, in its trace; a sampled one after it is exported alone."""
    p = await start_traced(raw_upstream.url)
    seen = await echoed(p.port, {"traceparent": f"00-{TRACE}-{PARENT}-00"})
    assert seen["traceparent"].startswith(f"00-{TRACE}-") and seen["traceparent"].endswith("-00")
    other = "0af7651916cd43dd8448eb211c80319c"
    await echoed(p.port, {"traceparent": f"00-{other}-{PARENT}-01"})
    spans = await receiver.wait_spans(1)
    # Spans are exported in the order they ended: the sampled-out one would have come first.
    assert [s.trace_id for s in spans] == [other]


async def test_ratio_zero_exports_nothing(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """OTEL_TRACES_SAMPLER=traceidratio with arg 0: requests are served and carry a not-sampled
    traceparent upstream; nothing is exported, not even at exit (which exports what is queued)."""
    p = await start_traced(
        raw_upstream.url, env={"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    )
    for _ in range(3):
        seen = await echoed(p.port, {"traceparent": f"00-{TRACE}-{PARENT}-01"})
        assert seen["traceparent"].startswith(f"00-{TRACE}-") and seen["traceparent"].endswith("-00")
    p.signal(signal.SIGTERM)
    assert await p.wait() == 0
    assert receiver.spans == []


async def test_drops_are_counted_and_traffic_goes_on_with_the_collector_down(
    start_traced: StartTraced, raw_upstream: rawupstream.RawUpstream
) -> None:
    """The collector's port refuses connections and the queue holds one span: every request is
    still answered, and the spans that did not fit are counted as dropped."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    p = await start_traced(
        raw_upstream.url,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": down,
            "OTEL_BSP_MAX_QUEUE_SIZE": "1",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1",
        },
    )
    for _ in range(20):
        assert (await get(p.port, "/echo"))[0] == 200
    assert await dropped(p) > 0


async def test_off_passes_traceparent_through_and_never_loads_opentelemetry(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """--no-tracing: the upstream gets the client's traceparent and tracestate as sent, and the
    router process never imports opentelemetry (an audit hook reports any import; with --tracing it
    reports one, which shows the hook works)."""
    entry = (sys.executable, "-c", WATCH_IMPORTS)
    for tracing in (False, True):
        p = await RouterProcess.start(
            "--upstream",
            raw_upstream.url,
            "--tracing" if tracing else "--no-tracing",
            entry=entry,
            env=otlp.environment(receiver.endpoint),
        )
        try:
            await p.wait_event("startup.listening")
            headers = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "a=1,b=2"}
            seen = await echoed(p.port, headers)
            imported = [e for e in p.events if e.get("line", "").startswith("opentelemetry imported")]
            if tracing:
                assert imported
                assert seen["traceparent"] != headers["traceparent"]
            else:
                assert not imported, imported
                assert (seen["traceparent"], seen["tracestate"]) == (headers["traceparent"], headers["tracestate"])
        finally:
            await p.kill()


async def test_tracing_without_the_extra_refuses_to_start() -> None:
    """--tracing without the otel extra installed: exit 2, naming the flag and the install."""
    code = "import sys; sys.modules['opentelemetry'] = None; from drain_router.cli import main; main()"
    p = await RouterProcess.start("--upstream", "http://127.0.0.1:9", "--tracing", entry=(sys.executable, "-c", code))
    assert await p.wait() == 2
    text = "\n".join(e.get("line", "") for e in p.events)
    assert "--tracing" in text and "pip install 'drain-router[otel]'" in text
    assert "Traceback" not in text


#: The router's entry point under an audit hook that prints a line for each opentelemetry import.
WATCH_IMPORTS = """\
import runpy, sys
def watch(event, args):
    if event == "import" and str(args[0]).partition(".")[0] == "opentelemetry":
        sys.stdout.write("opentelemetry imported: %s\\n" % args[0])
        sys.stdout.flush()
sys.addaudithook(watch)
runpy.run_module("drain_router", run_name="__main__", alter_sys=True)
"""


async def test_wait_until_is_the_only_clock(receiver: otlp.Receiver) -> None:
    """The receiver's wait gives up with a clear error (no sleeps stand in for synchronisation)."""
    try:
        await receiver.wait_spans(1, timeout=0.2)
    except TimeoutError as exc:
        assert "1 spans" in str(exc)
    else:
        raise AssertionError("no spans were sent")
    await wait_until(lambda: True, timeout=1, what="nothing")


SECRET_QUERY = "sk-abc"
SECRET_HEADER = "Bearer hdr-secret-4711"


async def test_query_values_and_credentials_never_reach_the_collector(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """1. a request ``/echo?api_key=sk-abc&model=x`` with ``Authorization``, ``Cookie`` and
    ``X-Api-Key`` headers 2. the span exported. Result: ``url.query`` is ``api_key=REDACTED&model=REDACTED``
    and neither the key nor any header's secret is anywhere in what the collector received (every
    byte of every export: attributes, events, names, resource); the upstream still got all of them.
    With ``--tracing-keep-query`` the query is recorded as sent (the headers still are not)."""
    headers = {"Authorization": SECRET_HEADER, "Cookie": "session=cookie-secret-99", "X-Api-Key": "xkey-secret-7"}
    secrets = [SECRET_QUERY, "hdr-secret-4711", "cookie-secret-99", "xkey-secret-7"]
    p = await start_traced(raw_upstream.url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{p.port}/echo?api_key={SECRET_QUERY}&model=x", headers=headers) as resp:
            assert resp.status == 200
            echoed = await resp.json()
    assert {k.lower(): v for k, v in echoed["headers"].items()}[
        "authorization"
    ] == SECRET_HEADER  # relayed as sent: only the span redacts
    [span] = await receiver.wait_spans(1)
    assert span.attributes["url.query"] == "api_key=REDACTED&model=REDACTED"
    assert span.attributes["url.path"] == "/echo"
    exported = b"".join(receiver.raw)
    for secret in secrets:
        assert secret.encode() not in exported, secret
        assert not [v for v in span.attributes.values() if secret in str(v)], (secret, span.attributes)

    receiver.spans.clear()
    receiver.raw.clear()
    q = await start_traced(raw_upstream.url, "--tracing-keep-query")
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{q.port}/echo?api_key={SECRET_QUERY}&model=x", headers=headers) as resp:
            assert resp.status == 200
    [kept] = await receiver.wait_spans(1)
    assert kept.attributes["url.query"] == f"api_key={SECRET_QUERY}&model=x"
    exported = b"".join(receiver.raw)
    for secret in secrets[1:]:
        assert secret.encode() not in exported, secret
