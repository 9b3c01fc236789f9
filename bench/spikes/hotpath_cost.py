"""The router's Python per request and per chunk, without sockets: its protocol objects (a client
connection, an upstream connection, the pool, the listener, metrics and the in-flight set, all as
shipped) driven with fake transports, so what is timed is the interpreter's work alone, with none of
the kernel's and none of the noise of a shared machine (the spread between runs is about 1 %).

    python -m bench.spikes.hotpath_cost [--requests N] [--chunks-per-read K] [--max-concurrent-requests N]
                                        [--tracing off|ratio0|ratio1]

Prints µs per small GET (the bench's request and the upstream's 200-byte answer, keep-alive) and µs
per relayed chunk of a chunked stream: one chunk per upstream read (paced), and K chunks per read
(a stream arriving in one read). Run it from two checkouts (``PYTHONPATH=...``) to compare a change.

``--tracing ratio0|ratio1`` runs it with ``--tracing`` on (the real SDK, ``traceidratio`` at 0 or 1);
the exporter encodes each batch to OTLP protobuf as the real one does and drops it instead of
POSTing it, in the SDK's export thread. ``cpu_small_get_us`` is the whole process's CPU (the export
thread included, the queue flushed before the clock stops) per small GET.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from drain_router import config, metrics
from drain_router.http1.client import ClientConnection
from drain_router.http1.listener import TrafficListener
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.state import RouterState

REQUEST = b"GET /small HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
SMALL = b'{"object":"model","padding":"' + b"x" * 170 + b'"}'
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(SMALL), SMALL)
STREAM_REQUEST = b"GET /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'data: {"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":" token"}]}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
# The stream's terminal event, then the last chunk (a stream ending without it is a truncated one).
LAST = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


class FakeTransport:
    """Takes writes and drops them; answers what the protocols ask."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        raise AssertionError("a keep-alive connection was closed")

    abort = close


def _tracer(mode: str) -> Any:
    """The router's tracer as ``--tracing`` makes it, at sampling ratio 0 or 1, exporting to nowhere."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from drain_router.tracing import sdk

    class Encoded(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    os.environ["OTEL_TRACES_SAMPLER"] = "traceidratio"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0" if mode == "ratio0" else "1"
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = "1000000"  # nothing dropped: every span's export is counted
    return sdk.Tracing("bench", lambda n: None, exporter=Encoded())


async def _measure(requests: int, per_read: int, limit: int = 0, tracing: str = "off") -> dict[str, float]:
    cfg = config.build_config(
        upstream="http://127.0.0.1:9", host="127.0.0.1", port=0, admin_port=0, max_concurrent_requests=limit
    )
    state = RouterState(cfg, metrics.Metrics(CollectorRegistry()))
    tracer = state.tracer = None if tracing == "off" else _tracer(tracing)
    pool = UpstreamPool(cfg, state.note_connect)
    listener = TrafficListener(state, pool, connection_limit=1000)
    client = ClientConnection(listener)
    client_transport = FakeTransport()
    client.connection_made(client_transport)
    up = UpstreamConnection(pool)
    up.connection_made(FakeTransport())
    pool.idle.append(up)

    def small_gets(n: int) -> None:
        for _ in range(n):
            client.data_received(REQUEST)
            up.data_received(RESPONSE)

    def stream(reads: int, chunks_per_read: int) -> None:
        body = CHUNK * chunks_per_read
        client.data_received(STREAM_REQUEST)
        up.data_received(STREAM_HEAD)
        for _ in range(reads):
            up.data_received(body)
        up.data_received(LAST)

    out: dict[str, float] = {}
    small_gets(1000)  # warm
    if tracer is not None:
        tracer.provider.force_flush()
    gc.collect()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    small_gets(requests)
    out["small_get_us"] = (time.perf_counter() - t0) / requests * 1e6
    if tracer is not None:
        tracer.provider.force_flush()  # the export thread's work for these requests, on the clock
    out["cpu_small_get_us"] = (time.process_time() - cpu0) / requests * 1e6
    reads = requests * 4
    stream(100, 1)
    t0 = time.perf_counter()
    stream(reads, 1)
    out["chunk_paced_us"] = (time.perf_counter() - t0) / reads * 1e6
    t0 = time.perf_counter()
    stream(reads // per_read, per_read)
    out[f"chunk_{per_read}_per_read_us"] = (time.perf_counter() - t0) / (reads // per_read * per_read) * 1e6
    assert client_transport.written > 0 and len(state.inflight) == 0
    if tracer is not None:
        tracer.shutdown()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--chunks-per-read", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is printed")
    parser.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=0,
        help="admission control on (no request ever waits: one at a time)",
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "ratio0", "ratio1"),
        default="off",
        help="--tracing on, sampling ratio 0 or 1 (the SDK's export thread encodes each batch)",
    )
    args = parser.parse_args(argv)
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for key, value in asyncio.run(
            _measure(args.requests, args.chunks_per_read, args.max_concurrent_requests, args.tracing)
        ).items():
            best[key] = min(value, best.get(key, value))
    for key, value in best.items():
        print(f"{key}: {value:.3f}")


if __name__ == "__main__":
    main()
