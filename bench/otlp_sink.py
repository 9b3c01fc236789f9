"""``python -m bench.otlp_sink --port P``: the bench's OTLP/HTTP collector, and nothing else.

Answers 200 (an empty ``ExportTraceServiceResponse``) to every ``POST .../v1/traces`` and counts,
per path, the export requests, their bytes (uncompressed) and the spans they carry; ``GET /stats`` returns
the counts as JSON. Each traced router of the bench exports to its own path
(``/<target>/v1/traces``), so one sink tells them apart. It runs in its own process, pinned like
the load generator, so that receiving the spans is not charged to the router.

Spans are counted by walking the protobuf wire format of ``ExportTraceServiceRequest``
(:func:`count_spans`) down to the spans, without decoding them: no dependency on the OpenTelemetry
packages, and little CPU.
"""

from __future__ import annotations

import argparse

from aiohttp import web

TRACES_SUFFIX = "/v1/traces"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _embedded(buf: bytes, start: int, end: int, field: int) -> list[tuple[int, int]]:
    """The (start, end) of each length-delimited ``field`` of the message in ``buf[start:end]``;
    every other field skipped. ``ValueError`` on a malformed message."""
    out = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            _, pos = _varint(buf, pos)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        elif kind == 2:
            size, pos = _varint(buf, pos)
            if number == field:
                out.append((pos, pos + size))
            pos += size
        else:
            raise ValueError(f"wire type {kind} not expected here")
        if pos > end:
            raise ValueError("field runs past its message")
    return out


def count_spans(body: bytes) -> int:
    """Spans in a protobuf ``ExportTraceServiceRequest``: its ``resource_spans`` (field 1), their
    ``scope_spans`` (field 2), their ``spans`` (field 2)."""
    return sum(
        len(_embedded(body, s_start, s_end, 2))
        for r_start, r_end in _embedded(body, 0, len(body), 1)
        for s_start, s_end in _embedded(body, r_start, r_end, 2)
    )


def app() -> web.Application:
    counts: dict[str, dict[str, int]] = {}

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        entry = counts.setdefault(request.path, {"requests": 0, "bytes": 0, "spans": 0, "undecoded": 0})
        entry["requests"] += 1
        entry["bytes"] += len(body)
        try:
            entry["spans"] += count_spans(body)  # aiohttp has undone a Content-Encoding
        except ValueError:
            entry["undecoded"] += 1
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(counts)

    application = web.Application(client_max_size=64 * 2**20)
    application.router.add_get("/stats", stats)
    application.router.add_post("/{prefix:.*}" + TRACES_SUFFIX, traces)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvloop

    web.run_app(app(), host="127.0.0.1", port=args.port, access_log=None, print=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
