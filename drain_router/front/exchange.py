"""One request through the front (:class:`FrontExchange`): the router's
:class:`~drain_router.http1.exchange.Exchange`, sent to a pod the front picks, with what only a tier
above the pods can do for it.

- **Its body is kept** when it has a length of at most
  :data:`~drain_router.decisions.continuation.MAX_BODY_BYTES`: read whole, then sent with its head in
  one write. A larger or chunked body streams to the pod as the router streams it, and is neither
  retried nor continued.
- **A refusal is retried once on another pod**: an answer that carries the pod's router's refusal
  mark (the model server never saw the request), except a 429, is swallowed and the request sent to
  another candidate pod (:func:`~drain_router.decisions.front.retry_reason`); so is a request whose
  pod's router could not be reached. With no other candidate, the client gets the refusal as it was.
- **A pod that says** ``Connection: close`` **is left** at that answer (:meth:`~.pods.Pods.leave`).
- **A cut stream is continued on another pod**: a streamed ``/v1/completions`` or
  ``/v1/chat/completions`` request that :func:`~drain_router.decisions.continuation.assess` finds
  continuable has its events followed as they are relayed (whole events only: a partial event waits
  for its end, so a cut never leaves half an event with the client). At the router's cut mark (its
  ``drain_deadline`` or ``upstream_truncated`` event, never relayed), or the connection cut
  mid-stream, :func:`~drain_router.decisions.continuation.at_cut` decides: the continuation is sent
  to another pod (waiting for one to be ready, at most ``--queue-timeout-secs``) and its events are
  rewritten into the same response (:func:`~drain_router.decisions.continuation.rewrite`); or
  ``[DONE]`` ends an answer that was complete; or the honest error event ends it.
"""

from __future__ import annotations

import json
from typing import Any

from drain_router import logs, tracing
from drain_router.decisions import continuation as cont_
from drain_router.decisions import front, spans
from drain_router.decisions.continuation import (
    MAX_BODY_BYTES,
    Continuable,
    CutAction,
    EventKind,
    RewriteAction,
    Splice,
    StreamTracker,
)
from drain_router.decisions.stream_ends import ends_stream
from drain_router.front.pods import Pod
from drain_router.http1 import answers, sse, traced
from drain_router.http1.exchange import Client, Destination, Exchange
from drain_router.http1.heads import CHUNKED, NONE, RequestHead
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.metrics import Outcome

log = logs.get("drain_router.front")

NO_POD: answers.Error = (503, "no_ready_pod", "no pod of this service is ready")

CONNECT_FAILED = "connect_failed"
RETRY_LEG = "retry"
"""``leg_failed``: the continuation was refused by the pod's router, and goes to another pod."""


class FrontExchange(Exchange):
    __slots__ = (
        "cont",
        "cut_at",
        "cut_event",
        "followed",
        "following",
        "held",
        "kept",
        "leg_answered",
        "leg_failed",
        "legs",
        "next_pod",
        "out",
        "passthrough",
        "pod",
        "retries",
        "skipping",
        "splice",
        "splitter",
        "tracker",
        "waiting_body",
    )

    def __init__(
        self,
        client: Client,
        dest: Destination,
        method: bytes,
        target: bytes,
        http10: bool,
        keep_alive: bool,
        request: RequestHead | None,
        problem: answers.Error | None,
    ) -> None:
        super().__init__(client, dest, method, target, http10, keep_alive, request, problem)
        self.kept: bytearray | None = (
            bytearray()
            if request is not None
            and problem is None
            and not request.chunked
            and not request.upgrade
            and (request.content_length or 0) <= MAX_BODY_BYTES
            else None
        )
        """The request's body, kept whole to be sent again (None: streamed, never sent again)."""
        self.waiting_body = False
        self.out: tuple[bytes, bytes] = (b"", b"")
        """What goes to the pod: the head and the body (the original's, or a continuation's)."""
        self.pod: Pod | None = None
        self.next_pod: Pod | None = None
        self.retries = 0
        self.skipping: str | None = None
        """The refusal being swallowed (its reason), until its body is read and the retry sent."""
        self.cont: Continuable | None = None
        self.following = False
        self.held: list[bytes] = []
        """A continuation's first events while they could be the answer's start echoed back."""
        self.passthrough = False
        """Past :data:`~drain_router.decisions.front.MAX_EVENT_BYTES` or ``MAX_FOLLOWED_BYTES``: relayed
        as it comes, as the router relays (its ends are the pod's router's)."""
        self.followed = 0
        """Event bytes followed so far (at most :data:`~drain_router.decisions.front.MAX_FOLLOWED_BYTES`)."""
        self.tracker: StreamTracker | None = None
        self.splitter: front.EventSplitter | None = None
        self.splice: Splice | None = None
        self.legs = 0
        """Continuations sent for this response."""
        self.leg_answered = False
        """The current continuation's pod answered its head."""
        self.leg_failed: str | None = None
        """Why the current continuation's answer is not an event stream (the response then ends)."""
        self.cut_at: float | None = None
        """Loop time of the cut the client is waiting since, until a continuation's first event
        reaches it (a continuation cut before its first event keeps the earlier cut's time)."""
        self.cut_event: bytes | None = None
        """The router's cut-mark event, relayed if the stream is not continued."""

    @property
    def site(self) -> Any:
        return self.dest

    # -- the request -------------------------------------------------------------------------------

    def send(self) -> None:
        request = self.request
        if self.kept is None or request is None:
            super().send()
            return
        if (request.content_length or 0) > self.client.listener.max_body:
            super().send()  # (the 413)
            return
        if request.expect_continue and not self.http10 and not self.req_done:
            self.client.transport.write(answers.CONTINUE)
        if self.req_done:
            self._go()
        else:
            self.waiting_body = True

    def request_body(self, data: bytes) -> None:
        if self.kept is None:
            super().request_body(data)
        elif not (self.discard or self.finished):
            self.kept += data

    def request_done(self) -> None:
        if self.kept is None:
            super().request_done()
            return
        self.req_done = True
        if self.waiting_body and not self.finished:
            self.waiting_body = False
            self._go()

    def _go(self) -> None:
        """The body is whole: assess it, and send it to a pod."""
        request = self.request
        assert request is not None and self.kept is not None
        body = bytes(self.kept)
        head = request.head
        site = self.site
        if self.method == b"POST":
            verdict = cont_.assess(self.method, self.target, body, site.dialect)
            if isinstance(verdict, Continuable):
                self.cont = verdict
                first = verdict.first_body()
                if first is not None:
                    body = json.dumps(first).encode()
                    head = front.resend_head(head, self.target, len(body))
        self.out = (head, body)
        self._to(site.pods.pick())

    def _to(self, pod: Pod | None) -> None:
        if pod is None:
            self.reply(NO_POD, Outcome.REJECTED, extra=answers.refused(NO_POD[1]))
            return
        self.pod = pod
        pod.pool.acquire(self)

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None:
        if self.kept is None:
            super().attach(up, reused=reused)
            return
        self.upstream = up
        self.reused = reused
        if self.client.write_paused:
            up.transport.pause_reading()
        head, body = self.out
        up.start(self, head + body)

    def retry(self) -> bool:
        if self.kept is None:
            return super().retry()
        if self.reused and not self.retried and self.pod is not None:
            self.retried = True
            self.pod.pool.acquire(self)
            return True
        return False

    def fail(self, error: answers.Error, outcome: Outcome) -> None:
        """The pod's router could not be reached: the request goes to another pod (once), or a cut
        stream's continuation is tried elsewhere."""
        if self.finished:
            return
        if self.pod is not None:
            self.site.pods.leave(self.pod)
        if self.legs:
            self._cut()
            return
        if self.kept is not None and self.retries == 0:
            other = self.site.pods.pick(exclude=self.pod)
            if other is not None:
                self.retries += 1
                self.site.own.retries.labels(CONNECT_FAILED).inc()
                self._to(other)
                return
        super().fail(error, outcome)

    # -- the response ------------------------------------------------------------------------------

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        up = self.upstream
        pod = self.pod if self.kept is not None else (self.site.pods.by_pool(up.pool) if up is not None else None)
        if pod is not None and front.closes(headers):
            self.site.pods.leave(pod)
        if self.legs:
            self._leg_head(status, headers)
            return
        reason = front.retry_reason(status, headers)
        if reason is not None and self.kept is not None and self.req_done and self.retries == 0:
            other = self.site.pods.pick(exclude=self.pod)
            if other is not None:
                self.skipping, self.next_pod = reason, other
                return
        super().response_head(status, headers)
        mark = front.refusal_mark(headers) if status >= 400 else None
        if mark is not None and self.body_at:
            # Relayed as it was (a 429, or no other pod to retry on): the mark stays, for a tier
            # above the front (the router's head drops it, as a model server's own).
            head = self.to_client[self.body_at - 1]
            self.to_client[self.body_at - 1] = head[:-2] + answers.refused(mark) + b"\r\n"
        if self.cont is not None and self.end is not None and self.mode == CHUNKED:
            self.following = True
            self.tracker = StreamTracker(self.cont.api)
            self.splitter = front.EventSplitter()

    def _leg_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A continuation's head: a 200 event stream goes on; anything else ends the response with
        the honest error (its body is not read)."""
        if front.retry_reason(status, headers) is not None:
            # The pod's router refused the continuation before its model server saw it: another pod
            # (each try counts against --max-continuations). Sent once this read is parsed.
            log.info("front.continuation_refused", status=status, path=self.path, pod=self._pod_url())
            self.leg_failed = RETRY_LEG
            return
        if sse.kind(self.target, status, headers):
            self.leg_answered = True
            self.splitter = front.EventSplitter()
            self.body_at = len(self.to_client)
            return
        # (Ended in flush, once the parser is done with this read: the connection is still parsing.)
        log.warning("front.continuation_refused", status=status, path=self.path, pod=self._pod_url())
        self.leg_failed = f"continuation_answered_{status}"

    def flush(self) -> None:
        if self.finished:
            return
        if self.skipping is not None:
            self.to_client.clear()
            self.body_at = 0
            if self.resp_done:
                self._retry_refused()
            return
        if self.leg_failed == RETRY_LEG:
            if self.pod is not None:
                self.site.pods.leave(self.pod)
            self._cut()
            return
        if self.leg_failed:
            self._give_up(self.leg_failed, abandoned=False)
            return
        if not self.following:
            super().flush()
            return
        tracker, splitter = self.tracker, self.splitter
        assert tracker is not None and splitter is not None
        out = self.to_client
        at = self.body_at
        self.body_at = 0
        if tracker.done:
            # The client's response is whole: what is left of this leg's body is read and dropped.
            del out[at:]
            if self.resp_done:
                self.finish(Outcome.COMPLETED)
            return
        body = b"".join(out[at:])
        del out[at:]
        relay: list[bytes] = []
        cut = False
        if self.passthrough:
            relay.append(body)
        elif body:
            self.followed += len(body)
            cut = self._events(splitter.feed(body), relay)
            if not cut and (splitter.overflow or self.followed > front.MAX_FOLLOWED_BYTES):
                # An event past its bound, or an answer past its own: the rest is relayed as it
                # comes, no longer followed (and never continued).
                relay.append(splitter.take_rest())
                self.passthrough = True
                tracker.parts.clear()
        if self.finished:
            return
        if relay:
            data = b"".join(relay)
            if data:
                out.append(b"%x\r\n%s\r\n" % (len(data), data))
        done = (tracker.done and not cut) or (self.passthrough and self.resp_done)
        if done:
            out.append(sse.LAST_CHUNK)
        self._write(out)
        if done:
            if self.resp_done:
                self.finish(Outcome.COMPLETED)
        elif cut or self.resp_done:
            self._cut()

    def _write(self, out: list[bytes]) -> None:
        transport = self.client.transport
        if out:
            if transport is not None:
                transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if not self.head_sent and self.code:
            self.head_sent = True
            listener = self.client.listener
            listener.metrics.ttfb.observe(listener.loop.time() - self.started_at)

    def _events(self, events: list[bytes], relay: list[bytes]) -> bool:
        """Follow and relay whole events; True at the router's cut mark (it and what follows it in
        this leg are not relayed). A continuation's events that could still be the answer echoed
        back wait in :attr:`held` until the next content decides."""
        tracker = self.tracker
        assert tracker is not None
        held = self.held
        for raw in events:
            data = front.event_data(raw)
            if data is None:
                self._relay(relay, raw)  # a comment, a keep-alive
                continue
            if tracker.unfollowed:
                # Not continuable any more (several choices, a tool call): relayed, its end and the
                # router's cut mark still told apart.
                if ends_stream(data):
                    tracker.done = True
                elif front.cut_mark_of(data) is not None:
                    self.cut_event = raw
                    return True
                self._relay(relay, raw)
                continue
            event = tracker.feed(data)
            if event.kind is EventKind.CUT:
                self.cut_event = raw
                return True
            if self.legs == 0 or event.kind is not EventKind.CHUNK or self.splice is None:
                self._relay(relay, raw)
                continue
            self.splice, rewritten = cont_.rewrite(self.splice, event.json)
            action = rewritten.action
            if action is RewriteAction.ABANDON:
                self._abandon()
                return False
            if action is RewriteAction.HOLD:
                held.append(b"data: " + rewritten.data + b"\n\n")
            elif action is RewriteAction.RELAY:
                self._relay(relay, b"data: " + rewritten.data + b"\n\n")
        return False

    def _relay(self, relay: list[bytes], event: bytes) -> None:
        """``event`` to the client, after the events held before it; the first of a continuation's
        ends the gap at its cut."""
        if self.held:
            relay.extend(self.held)
            self.held.clear()
        relay.append(event)
        if self.cut_at is not None and self.legs:
            self.site.own.gap.observe(self.site.loop.time() - self.cut_at)
            self.cut_at = None

    def _retry_refused(self) -> None:
        """The refusal was read whole: its connection goes back (or closes), the request goes to the
        pod picked when it came."""
        reason, pod = self.skipping, self.next_pod
        self.skipping, self.next_pod = None, None
        up = self.upstream
        if up is not None:
            self.upstream = None
            up.pool.done_with(up, up.keep_alive, True, False)
        self.resp_done = False
        self.code = 0
        self.mode = NONE
        self.retries += 1
        self.site.own.retries.labels(reason).inc()
        log.info("front.retry", reason=reason, path=self.path, pod=self._pod_url(), to=pod.url if pod else None)
        if pod is None or not pod.candidate:
            pod = self.site.pods.pick(exclude=self.pod)
        self._to(pod)

    def _pod_url(self) -> str | None:
        return self.pod.url if self.pod is not None else None

    # -- cuts --------------------------------------------------------------------------------------

    def upstream_lost(self, exc: BaseException | None, *, invalid: bool = False) -> None:
        if self.finished:
            return
        if self.skipping is not None:
            self.upstream = None
            self._retry_refused()
            return
        if invalid and self.following and (not self.legs or self.leg_answered):
            # What the read parsed before its invalid bytes (the head with it, on a first read) is
            # not flushed yet: its whole events reach the client first, as at any read.
            self.upstream = None
            legs = self.legs
            self.flush()
            if self.finished or self.legs != legs:
                return  # (ended, or cut and continued, at a cut mark in that read)
        if self.following and self.tracker is not None and self.tracker.done:
            self.upstream = None
            self.finish(Outcome.COMPLETED)  # (its [DONE] and last chunk were written)
            return
        if self.following and self.passthrough:
            # Relayed as the router relays: the cut reaches the client as a cut.
            self.upstream = None
            if self.client.transport is not None:
                self.client.transport.abort()
            self.finish(Outcome.UPSTREAM_ERROR)
            return
        if self.following or (self.legs and not self.leg_answered):
            self.upstream = None
            if not self.legs and self.code == 0:
                super().upstream_lost(exc, invalid=invalid)
                return
            self._cut()
            return
        super().upstream_lost(exc, invalid=invalid)

    def _drop_upstream(self) -> None:
        up = self.upstream
        if up is not None:
            self.upstream = None
            up.exchange = None
            up.pool.done_with(up, False, False, False)

    def _cut(self) -> None:
        """The stream was cut (or ended without ``[DONE]``): continue it, finish it or end it honestly.
        A continuation cut while its first events are held (undecided: the answer's start, or more
        of it) ends honestly: the tracker has followed text the client never got."""
        self._drop_upstream()
        if self.held:
            self.held.clear()
            self._give_up(cont_.Reason.NOT_EXTENDED.value, abandoned=True)
            return
        assert self.cont is not None and self.tracker is not None
        now = self.site.loop.time()
        decision = cont_.at_cut(
            self.cont, self.tracker, continuations=self.legs, max_continuations=self.site.max_continuations
        )
        if decision.action is CutAction.FINISH:
            self.site.own.continuations.labels("finished").inc()
            log.info("front.stream_finished", path=self.path, legs=self.legs)
            last = cont_.finish_event(self.tracker) or b""
            self._end(sse.framed(last + cont_.DONE_EVENT, CHUNKED) + sse.LAST_CHUNK, Outcome.COMPLETED)
            return
        if decision.action is CutAction.GIVE_UP:
            assert decision.reason is not None
            self._give_up(decision.reason.value, abandoned=False)
            return
        request = decision.request
        assert request is not None
        self.splice = Splice.start(self.cont, self.tracker, request)
        self.tracker.start_leg()
        self.legs += 1
        self.leg_answered = False
        self.leg_failed = None
        if self.cut_at is None:
            self.cut_at = now
        self.resp_done = False
        body = json.dumps(request.body).encode()
        head, _ = self.out
        self.out = (front.resend_head(head, request.path.encode("latin-1"), len(body)), body)
        self.site.own.continuations.labels("continued").inc()
        tracing.event(self, spans.CONTINUED)
        log.info(
            "front.continuing",
            path=self.path,
            leg=self.legs,
            tokens_before=request.tokens_before,
            by_token_ids=request.by_token_ids,
            cut_pod=self._pod_url(),
        )
        cut_pod = self.pod
        pod = self.site.pods.pick(exclude=cut_pod)
        if pod is not None:
            self._to(pod)
        else:
            self.site.when_ready(self._resume, cut_pod)

    def _resume(self, ready: bool) -> None:
        if self.finished:
            return
        pod = self.site.pods.pick(exclude=self.pod) if ready else None
        if pod is None:
            self._give_up("no_ready_pod", abandoned=False)
            return
        self._to(pod)

    def _abandon(self) -> None:
        """The continuation did not extend the answer: it is closed, and the response ends honestly."""
        self._drop_upstream()
        self._give_up(cont_.Reason.NOT_EXTENDED.value, abandoned=True)

    def _give_up(self, reason: str, *, abandoned: bool) -> None:
        self._drop_upstream()
        self.site.own.continuations.labels("abandoned" if abandoned else "given_up").inc()
        log.warning("front.stream_given_up", path=self.path, reason=reason, legs=self.legs)
        event = self.cut_event or sse.TRUNCATED_EVENT
        self.truncated = 1
        self._end(sse.framed(event, CHUNKED) + sse.LAST_CHUNK, Outcome.UPSTREAM_ERROR)

    def _end(self, data: bytes, outcome: Outcome) -> None:
        self.to_client.clear()
        self.to_client.append(data)
        self._write(self.to_client)
        self.resp_done = True
        self.finish(outcome)

    def abort_deadline(self) -> None:
        """The front's own deadline: a followed stream is at an event boundary (partial events are
        held), so it gets the deadline event before it is cut."""
        if self.finished:
            return
        if self.following and self.head_sent and self.client.transport is not None:
            self.client.transport.write(sse.framed(sse.DEADLINE_EVENT, CHUNKED))
            self.finish(Outcome.DEADLINE_ABORTED)
            self.client.abort_for_deadline()
            return
        super().abort_deadline()

    def finish(self, outcome: Outcome) -> None:
        if not self.finished and self.cut_at is not None:
            self.site.cancel_wait(self._resume)
        super().finish(outcome)


class TracedFrontExchange(traced.Traced, FrontExchange):
    """A front exchange with a span (``--tracing``): each continuation is a ``drain_router.continued``
    event on it."""

    __slots__ = traced.SLOTS
