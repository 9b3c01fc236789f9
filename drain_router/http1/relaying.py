"""The response half of an exchange, off the per-chunk path: a body not re-chunked (its tail), how a
server-sent-events stream ends without its terminal event or at the deadline (:mod:`.sse` decides
what the client gets), the upstream connection lost mid-response, and the router's own error
answers. An :class:`~drain_router.http1.exchange.Exchange` calls these with itself, as the
:class:`Relayed` they act on; relaying a chunked body read by read (``flush``) and the final head
stay the exchange's own (the hot path: no extra call)."""

from __future__ import annotations

from typing import Protocol

from drain_router import logs
from drain_router.http1 import answers, forwarding, sse
from drain_router.http1.forwarding import Forwarded
from drain_router.http1.heads import CHUNKED, SMALL
from drain_router.metrics import Outcome

log = logs.get("drain_router.proxy")

#: ``Exchange.truncated``: the stream ended without its terminal event; CUT: and the client
#: connection is to be cut (mid-event, a chunked body).
TRUNCATED, CUT = 1, 2


def log_request(exchange: Relayed, status: int, outcome: Outcome, duration: float) -> None:
    """The access log line of an exchange that ended (``--access-log``)."""
    log.info(
        "request",
        method=exchange.method.decode("latin-1"),
        path=exchange.path,
        status=status,
        outcome=outcome,
        duration_s=round(duration, 6),
        remote=exchange.client.peer.decode("latin-1"),
        **({"truncated": True} if exchange.truncated else {}),
    )


class Relayed(Forwarded, Protocol):
    """The exchange whose response is relayed, as relaying acts on it."""

    code: int
    mode: int
    until_eof: bool
    close: bool
    body_at: int
    head_sent: bool
    end: sse.StreamEnd | None
    truncated: int

    @property
    def keep_alive(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def target(self) -> bytes: ...
    @property
    def finished(self) -> bool: ...

    def finish(self, outcome: Outcome) -> None: ...


def watch(exchange: Relayed, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    """A response to an OpenAI-style path: an event stream's end is watched (:class:`~.sse.StreamEnd`)."""
    kind = sse.kind(exchange.target, status, headers)
    exchange.end = sse.StreamEnd(kind) if kind else None


def last_chunk(exchange: Relayed, end: sse.StreamEnd, out: list[bytes]) -> None:
    """A chunked body ended: the last chunk, or what a truncated stream gets (:func:`truncated`)."""
    if end.ended_honestly():
        out.append(sse.LAST_CHUNK)
    else:
        truncated(exchange, end, out)


def track(exchange: Relayed, end: sse.StreamEnd, out: list[bytes]) -> None:
    """A read of a body that is not re-chunked (of known length, or close-delimited for an HTTP/1.0
    client): its pieces watched, and a stream that ended without its terminal event told
    (:func:`truncated`). A small body of known length waits whole in ``out`` for its one write: its
    pieces are watched once, when it is whole."""
    at = exchange.body_at
    if exchange.mode == SMALL:
        if not exchange.resp_done:
            return
        if len(out) > at:
            end.feed(out, at)
    else:
        if len(out) > at:
            end.feed(out, at)
        exchange.body_at = 0  # what this read brought is written now
    if exchange.resp_done and not end.ended_honestly():
        truncated(exchange, end, out)


def truncated(exchange: Relayed, end: sse.StreamEnd, out: list[bytes]) -> None:
    """The stream ended without its terminal event: what :func:`~.sse.truncated_end` says goes on
    ``out`` (this read's last bytes), and it is logged."""
    written, cut = sse.truncated_end(exchange.mode, end.at_boundary())
    exchange.truncated = CUT if cut else TRUNCATED
    out.append(written)
    log.warning("proxy.stream_truncated", path=exchange.path, status=exchange.code, error_event=bool(written), cut=cut)


def end_truncated(exchange: Relayed) -> None:
    """After the last write of a truncated stream: cut the client connection if it must be, and
    count it the model server's failure."""
    transport = exchange.client.transport
    if exchange.truncated == CUT and transport is not None:
        transport.abort()
    exchange.finish(Outcome.UPSTREAM_ERROR)


def deadline(exchange: Relayed) -> None:
    """Before the in-flight deadline cuts it, a stream gets what :func:`~.sse.deadline_end` says."""
    transport = exchange.client.transport
    end = exchange.end
    if end is not None and exchange.head_sent and transport is not None:
        transport.write(sse.deadline_end(exchange.mode, end.at_boundary()))


def upstream_lost(exchange: Relayed, exc: BaseException | None, invalid: bool) -> None:
    """The upstream connection closed (or sent something the router will not relay) while the
    exchange owned it. Until the final head is written the client can still be told with a 502."""
    exchange.upstream = None
    if exchange.finished:
        return
    if not invalid and exc is None and exchange.until_eof and exchange.code:
        exchange.resp_done = True  # a close-delimited body ends with the connection
        exchange.flush()
        return
    if not invalid and answered(exchange):
        # Its terminal event was relayed: the client has the whole answer, and gets its end.
        log.warning("proxy.upstream_cut_after_end", error=repr(exc), path=exchange.path)
        exchange.resp_done = True
        exchange.flush()
        return
    exchange.to_client.clear()
    exchange.body_at = 0
    if not exchange.code and not invalid and forwarding.retry(exchange):
        return
    log.warning("proxy.upstream_invalid" if invalid else "proxy.upstream_cut", error=repr(exc), path=exchange.path)
    if not exchange.head_sent:
        exchange.reply(answers.BAD_RESPONSE if invalid else answers.CUT, Outcome.UPSTREAM_ERROR)
        return
    # The status went out and can no longer change: close the client connection without the
    # terminating chunk, so the client sees the stream cut.
    if exchange.client.transport is not None:
        exchange.client.transport.abort()
    exchange.finish(Outcome.UPSTREAM_ERROR)


def answered(exchange: Relayed) -> bool:
    """A chunked event stream whose relayed bytes (all written) end with its terminal event."""
    end = exchange.end
    return (
        end is not None
        and exchange.mode == CHUNKED
        and exchange.head_sent
        and not exchange.to_client
        and end.ended_honestly()
    )


def reply(exchange: Relayed, error: answers.Error, outcome: Outcome, close: bool, extra: bytes = b"") -> None:
    """A JSON error of the router's own, written now (in-flight covers it); ``extra``: header lines."""
    status, kind, message = error
    exchange.code = status
    client = exchange.client
    close = close or client.closes_after(exchange.keep_alive)
    exchange.close = close
    if client.transport is not None:
        client.transport.write(
            answers.error(
                status,
                kind,
                message,
                close=close,
                keep_alive_10=exchange.http10,
                head_only=exchange.method == b"HEAD",
                extra=extra,
            )
        )
    exchange.head_sent = True
    exchange.finish(outcome)
