"""The front on a real engine: streams cut mid-way by a pod's restart, continued on the other pod by
``drain-router front`` and spliced into the same response, with llama.cpp's OpenAI-compatible server
(llama-cpp-python, SmolLM2-135M on the CPU) as the model server and the OpenAI SDK as the clients.

Each pod is an engine (one completion at a time, the others queued in it) and a ``drain-router
serve`` in front of it with a short grace (``--shutdown-drain-secs 0 --termination-grace-secs 3``):
its deadline comes 1 s after its SIGTERM, and what is still streaming then is cut with the router's
``drain_deadline`` event. The front (``--pods`` both routers, ``--continuation completions``, probing
them every 200 ms) continues a cut ``/v1/completions`` stream on the other pod with the prompt plus
the text so far, ``max_tokens`` reduced. Every request is a greedy, seeded text completion of one of
:data:`PROMPTS`.

1. Rolling restarts, streams longer than the grace: three SDK clients (``max_retries=0``) stream
   completions of :data:`MAX_TOKENS` tokens (about 3 s each on one engine alone here) back to back,
   and each pod is restarted in turn, once a stream runs on it, the way the kubelet ends a pod with
   the chart's hooks (router SIGTERM and the engine's preStop hold on ``/admin/drain-wait``, then the
   engine's SIGTERM; both started again on the same ports); two such rollouts, the second once the
   streams of the first have ended. Two arms, the same load and restarts: through the front, every
   stream completes (one ``id``, one ``finish_reason`` on its last chunk, no exception: 0 lost) and
   at least one was continued; the control, the clients straight to the routers (each client's
   requests to the two in turn), sees the cut streams end with the router's error event (the SDK
   raises): at least one lost. Reported: streams, cuts, continuations, and the client's wait at a
   cut, p50/p99 (from the chunk before the cut to the next; each continuation matched to its stream
   by the ``front.continuing`` log line's time and ``tokens_before``; a continuation cut again before
   its first token is one wait with two cuts) beside the longest wait between chunks of a stream not
   cut, and the front's ``drain_router_front_continuation_gap_seconds`` (buckets interpolated, and
   its mean). The other pod's engine is busy: the wait at a cut is mostly the queue there.
2. Identity: each prompt streamed through the front whole, then again and cut after a random number
   of chunks (seeded: :data:`CUT_SEED`) by SIGKILL of the router serving it (its connection cut
   mid-stream), continued on the other pod, idle. Every continued answer is well-formed (one ``id``,
   one ``finish_reason`` on its last chunk, one ``[DONE]``, last, no error event) and equals the
   uninterrupted one up to the cut. Reported, with no target (it is the engine's: a partial answer
   re-tokenized and prefilled in a batch is not bit for bit the one-token-at-a-time decode that wrote
   it): how many are byte-identical, for the others how far after the cut (characters) the first
   difference is, and the client's wait at the cut (a prefill on an idle engine).

Measured on a shared 2-core machine: the file takes about 2.5 minutes. Run alone with ``pytest
e2e/test_front_real_engine.py`` (or ``pytest -m engine``); needs ``make engine`` (skipped without
it, failed with ``CI`` set).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drain_router_dev import cluster
from drain_router_dev.process import LOOPBACK, Process, free_port, wait_until
from e2e import real_engine
from e2e.real_engine import Outcome, Record, RouterPod

pytestmark = pytest.mark.engine

REPLICAS = 2
GRACE_SECS = 3
"""The pods' routers' ``--termination-grace-secs``: their deadline is at SIGTERM + 1 s (the grace less
the router's 2 s margin)."""
CLIENTS = 3
"""Three clients on two single-slot engines: one pod generating and one with a stream queued, so that
a restart cuts a stream mid-way and often one that has not started yet."""
MAX_TOKENS = 160
"""About 3 s a stream on one engine alone here (55 to 65 tokens a second), longer than the 1 s from
SIGTERM to the deadline."""
CYCLES = 2
"""Rollouts, each restarting every pod once: a stream is cut at most once a pod, twice a rollout."""
PROMPTS = (
    "A guide to planting tomatoes:",
    "How computers work:",
    "Ten tips for better sleep:",
    "Steps to change a tyre:",
    "Photosynthe",
    "The causes of the French Revol",
    "The life cycle of a butterf",
    "The history of the Roman Emp",
)
"""Text-completion prompts whose greedy answers run past :data:`MAX_TOKENS` and where no cut would
look like an echo to the front: it abandons a continuation whose first word is a prefix of the answer
so far (the engine echoing the partial back), and an answer that starts with a common word (" of",
",", "\\n" and "The") meets that word again. Over 26 everyday prompts, a cut before 1.2 % of the
tokens of their answers would be abandoned so (51 of 4,123); before none of these answers' tokens."""
IDENTITY_TOKENS = 96
CUT_SEED = 1
GAP_METRIC = "drain_router_front_continuation_gap_seconds"
CONTINUATIONS_METRIC = "drain_router_front_continuations_total"


class Front:
    """``drain-router front --pods ...`` on fixed loopback ports, continuing ``/v1/completions``."""

    def __init__(self, logs: Path, pods: list[str]) -> None:
        self.pods = pods
        self.port = free_port()
        self.admin_port = free_port()
        self.process = cluster.command_process(
            "front",
            logs,
            "front",
            self.port,
            *("--admin-host", LOOPBACK, "--admin-port", str(self.admin_port)),
            *("--pods", ",".join(pods), "--continuation", "completions"),
            *("--shutdown-drain-secs", "0", "--poll-interval-secs", "0.2"),
        )

    @property
    def url(self) -> str:
        return cluster.loopback_url(self.port)

    async def samples(self, session: aiohttp.ClientSession) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every sample of its ``/metrics``, by sample name."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"{cluster.loopback_url(self.admin_port)}/metrics"
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            resp.raise_for_status()
            text = await resp.text()
        out: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name].append((sample.labels, sample.value))
        return out

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        """Until the front counts every pod ready (``drain_router_front_ready_pods``)."""

        async def ready() -> float:
            if not self.process.alive:
                raise self.process.failed("exited")
            try:
                samples = await self.samples(session)
            except (aiohttp.ClientError, OSError, TimeoutError):
                return -1.0
            return sum(value for _, value in samples.get("drain_router_front_ready_pods", []))

        await wait_until(
            ready, timeout, f"the front to count {len(self.pods)} pods ready", until=lambda n: n == len(self.pods)
        )

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.process.start()
        await self.wait_ready(session)

    def logged(self, event: str) -> list[dict[str, Any]]:
        """Its log lines of ``event``, from its start."""
        out = []
        for line in self.process.log_path.read_text().splitlines():
            if f'"{event}"' in line:
                record = json.loads(line)
                if record.get("event") == event:
                    out.append(record)
        return out


def _epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); NaN for none."""
    if not values:
        return math.nan
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))]


def _histogram_quantile(buckets: list[tuple[dict[str, str], float]], q: float) -> float:
    """Prometheus's ``histogram_quantile``: the bucket the rank falls in, linearly interpolated."""
    cumulative = sorted((float(labels["le"]), count) for labels, count in buckets)
    total = cumulative[-1][1] if cumulative else 0.0
    if not total:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
        lower, below = upper, count
    return lower


def _wait_at_cut(record: Record, at: float, tokens_before: int) -> int | None:
    """Which of ``record``'s waits holds a cut logged at ``at`` after ``tokens_before`` tokens: the
    index of the chunk that carried the ``tokens_before``-th text, when the cut falls between it and
    the next (50 ms of slack before: the front logs the cut a moment after it relayed that chunk, the
    client reads it a moment after that)."""
    seen = 0
    for i, text in enumerate(record.texts):
        seen += bool(text)
        if seen == tokens_before:
            if i + 1 < len(record.times) and record.times[i] - 0.05 <= at <= record.times[i + 1]:
                return i
            return None
    return None


def _gaps(records: list[Record], continuing: list[dict[str, Any]]) -> tuple[list[float], list[float], int, int]:
    """The client's waits at the cuts, each continuation matched to its stream by time and
    ``tokens_before`` (one wait may hold several cuts: a continuation cut again before its first
    token), the longest wait between chunks of each completed stream that was not cut, how many
    continuations re-sent a stream that had no token yet (the client saw that wait before its first
    chunk) and how many matched no stream."""
    waits: dict[tuple[int, int], float] = {}
    resent = unmatched = 0
    for event in continuing:
        if event["tokens_before"] == 0:
            resent += 1
            continue
        at = _epoch(event["timestamp"])
        found = [
            (r.times[i + 1] - r.times[i], n, i)
            for n, r in enumerate(records)
            if (i := _wait_at_cut(r, at, event["tokens_before"])) is not None
        ]
        if not found:
            unmatched += 1
            continue
        gap, n, i = max(found)
        waits[n, i] = gap
    cut = {n for n, _ in waits}
    usual = [r.longest_gap() for n, r in enumerate(records) if n not in cut and r.outcome is Outcome.COMPLETED]
    return list(waits.values()), usual, resent, unmatched


def _kinds(records: list[Record]) -> str:
    counts = collections.Counter(f"{r.outcome.value}: {r.detail[:90]}" for r in records)
    return "; ".join(f"{k} x{n}" for k, n in counts.most_common(4))


async def _streaming(pod: RouterPod, session: aiohttp.ClientSession) -> bool:
    return (await pod.router.metrics(session)).inflight > 0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("arm", ["front", "straight-to-the-routers"])
async def test_rolling_restarts_with_streams_longer_than_the_grace(
    arm: str,
    engine_installed: None,
    processes: list[Process],
    session: aiohttp.ClientSession,
    logs: Path,
    report: list[str],
) -> None:
    """1. two pods (an engine and a router with a 1 s deadline), through the front or straight to
    the routers, three SDK clients streaming text completions 2. each pod in turn, once a stream runs
    on it: terminate (router SIGTERM, the engine's preStop hold, engine SIGTERM), wait for the exits,
    start again, wait until the front counts it ready. Result: through the front, every stream
    completed and at least one was continued; straight to the routers, some were lost."""
    started = time.monotonic()
    pods = [RouterPod(f"pod-{i}", logs, 0, GRACE_SECS, cut_at_deadline=True) for i in range(REPLICAS)]
    for pod in pods:
        processes.extend(pod.processes)
    await asyncio.gather(*(pod.start(session) for pod in pods))
    front: Front | None = None
    if arm == "front":
        front = Front(logs, [pod.router.url for pod in pods])
        processes.append(front.process)
        await front.start(session)
        load = real_engine.SdkLoad(front.url, CLIENTS, MAX_TOKENS, prompts=PROMPTS)
    else:
        load = real_engine.SdkLoad("", CLIENTS, MAX_TOKENS, prompts=PROMPTS, round_robin=[p.router.url for p in pods])

    def completed() -> int:
        return load.count(Outcome.COMPLETED)

    restarts: list[float] = []
    await load.start()
    try:
        await wait_until(completed, 60, f"{CLIENTS} completed streams", until=lambda n: n >= CLIENTS)
        lost_before = [r for r in load.records if r.outcome is not Outcome.COMPLETED]
        assert not lost_before, f"lost before any restart: {_kinds(lost_before)}"
        for cycle in range(CYCLES):
            if cycle:
                # One rollout at a time: what the last one cut has ended before the next begins.
                settled = functools.partial(load.settled_since, time.monotonic())
                await wait_until(settled, 60, "the last rollout's streams ended")
            for pod in pods:
                await wait_until(lambda pod=pod: _streaming(pod, session), 30, f"a stream on {pod.name}")
                restarts.append(time.time())
                await pod.terminate(session)
                await pod.start(session)
                if front is not None:
                    await front.wait_ready(session)
        want = completed() + CLIENTS
        await wait_until(completed, 60, f"{want} completed streams", until=lambda n: n >= want)
    finally:
        records = await load.stop()
    elapsed = time.monotonic() - started

    counts = {o: sum(r.outcome is o for r in records) for o in Outcome}
    lost = [r for r in records if r.outcome is not Outcome.COMPLETED]
    summary = (
        f"{arm}: {len(records)} streams, {counts[Outcome.COMPLETED]} completed, {counts[Outcome.REFUSED]} refused, "
        f"{counts[Outcome.TRUNCATED]} truncated; {len(restarts)} restarts in {elapsed:.0f} s"
    )
    if front is None:
        report.append(summary + (f" ({_kinds(lost)})" if lost else ""))
        assert any(r.outcome is Outcome.TRUNCATED for r in lost), (
            f"nothing cut straight to the routers: the clients cannot see a loss. {summary}"
        )
        return

    samples = await front.samples(session)
    outcomes = {labels["outcome"]: int(v) for labels, v in samples[CONTINUATIONS_METRIC]}
    continuing = front.logged("front.continuing")
    at_cut, usual, resent, unmatched = _gaps(records, continuing)
    buckets = samples[f"{GAP_METRIC}_bucket"]
    summary += (
        f"; cuts {sum(outcomes.values())} ({outcomes}), {len(continuing)} continuations "
        f"({resent} of streams with no token yet, {unmatched} unmatched); client's wait at the cuts "
        f"p50 {_quantile(at_cut, 0.5):.2f} s p99 {_quantile(at_cut, 0.99):.2f} s over {len(at_cut)} waits "
        f"(max {max(at_cut, default=math.nan):.2f} s); longest gap of a stream not cut p50 "
        f"{_quantile(usual, 0.5):.3f} s p99 {_quantile(usual, 0.99):.3f} s; front histogram p50 "
        f"{_histogram_quantile(buckets, 0.5):.2f} s p99 {_histogram_quantile(buckets, 0.99):.2f} s "
        f"(count {int(samples[f'{GAP_METRIC}_count'][0][1])}, mean "
        f"{samples[f'{GAP_METRIC}_sum'][0][1] / max(1.0, samples[f'{GAP_METRIC}_count'][0][1]):.2f} s)"
    )
    report.append(summary)
    print(summary)
    assert not lost, f"{len(lost)} lost through the front: {_kinds(lost)}. {summary}"
    assert outcomes.get("continued", 0) >= 1, f"no stream was continued: the restarts cut nothing. {summary}"
    assert len(continuing) == outcomes["continued"], (continuing, outcomes)


# -- identity ------------------------------------------------------------------------------------


class Answer:
    """A streamed response read whole, as an SSE client reads it."""

    def __init__(self, status: int, raw: bytes, times: list[float], *, cut: bool = False) -> None:
        self.status = status
        self.raw = raw
        self.cut = cut
        """The body ended before its end (its connection was cut)."""
        self.times = times
        """When each chunk's data line was read (monotonic)."""
        self.events: list[str] = []
        for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
            lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                self.events.append(b"\n".join(lines).decode())
        self.chunks = [json.loads(e) for e in self.events if e != "[DONE]"]
        self.texts = [c["choices"][0].get("text") or "" for c in self.chunks if c.get("choices")]

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def problems(self) -> list[str]:
        """What makes it not one well-formed stream (none: it is)."""
        out = []
        if self.cut:
            out.append("the body was cut")
        if self.status != 200:
            out.append(f"status {self.status}")
        if self.events.count("[DONE]") != 1 or self.events[-1:] != ["[DONE]"]:
            out.append("not one [DONE], last")
        if any("error" in c for c in self.chunks):
            out.append(f"an error event: {[c['error'] for c in self.chunks if 'error' in c]}")
        if len({c.get("id") for c in self.chunks}) != 1:
            out.append("several ids")
        finishes = [c["choices"][0].get("finish_reason") for c in self.chunks if c.get("choices")]
        if not finishes or not finishes[-1] or any(finishes[:-1]):
            out.append(f"finish_reason not on the last chunk alone: {finishes[-3:]}")
        return out

    def text_before(self, tokens: int) -> str:
        """The text of its first ``tokens`` chunks that carry text."""
        return "".join([t for t in self.texts if t][:tokens])

    def gap_after(self, tokens: int) -> float:
        """The wait from the chunk that carried the ``tokens``-th text to the next chunk."""
        seen = 0
        for i, text in enumerate(self.texts):
            seen += bool(text)
            if seen == tokens:
                return self.times[i + 1] - self.times[i]
        raise AssertionError(f"no chunk after {tokens} texts")


class RouterKiller:
    """Cuts a stream the way a crashed pod does: at its first chunk, finds the pod whose router
    serves it; at the cut, SIGKILLs that router (its connection to the front cut mid-stream)."""

    def __init__(self, pods: list[RouterPod], session: aiohttp.ClientSession) -> None:
        self.pods = pods
        self.session = session
        self.serving: RouterPod | None = None
        self.killed: RouterPod | None = None

    async def first_chunk(self) -> None:
        busy = [pod for pod in self.pods if await _streaming(pod, self.session)]
        assert len(busy) == 1, [pod.name for pod in busy]
        self.serving = busy[0]

    def cut(self) -> None:
        assert self.serving is not None
        self.serving.router.process.kill()
        self.killed = self.serving


async def _stream(url: str, prompt: str, *, after: int = 0, killer: RouterKiller | None = None) -> Answer:
    """A streamed completion of ``prompt`` through ``url``, read to its end; with ``killer``, cut once
    ``after`` chunks are in."""
    body = {**real_engine.completion_body(prompt, IDENTITY_TOKENS), "stream": True}
    raw = b""
    times: list[float] = []
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"{url}/v1/completions", json=body) as resp,
    ):
        try:
            async for line in resp.content:
                raw += line
                if line.startswith(b"data: {"):
                    times.append(time.monotonic())
                    if killer is not None and len(times) == 1:
                        await killer.first_chunk()
                    if killer is not None and len(times) == after:
                        killer.cut()
        except aiohttp.ClientPayloadError:
            return Answer(resp.status, raw, times, cut=True)
        return Answer(resp.status, raw, times)


def _first_difference(a: str, b: str) -> int | None:
    """Where ``a`` and ``b`` first differ (None: they are equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.timeout(120)
async def test_a_greedy_stream_cut_at_random_is_continued_well_formed(
    engine_installed: None,
    processes: list[Process],
    session: aiohttp.ClientSession,
    logs: Path,
    report: list[str],
) -> None:
    """1. two pods behind the front 2. each prompt: streamed whole; streamed again and cut after a
    random number of chunks (SIGKILL of the router serving it), continued on the other pod; the
    router started again. Result: every continued answer well-formed and equal to the whole one up to
    the cut; the rate of byte-identical answers and the distance to the first difference reported."""
    started = time.monotonic()
    pods = [RouterPod(f"pod-{i}", logs, 0, GRACE_SECS) for i in range(REPLICAS)]
    for pod in pods:
        processes.extend(pod.processes)
    await asyncio.gather(*(pod.start(session) for pod in pods))
    front = Front(logs, [pod.router.url for pod in pods])
    processes.append(front.process)
    await front.start(session)
    rng = random.Random(CUT_SEED)
    identical = 0
    distances: list[int] = []
    cuts: list[int] = []
    """Each cut: the tokens the client had before it."""
    gaps: list[float] = []
    """Each cut: the client's wait from the chunk before it to the next (the other pod is idle)."""
    for prompt in PROMPTS:
        whole = await _stream(front.url, prompt)
        assert not whole.problems(), (prompt, whole.problems(), whole.raw[-300:])
        after = rng.randint(1, len([t for t in whole.texts if t]) - 2)
        killer = RouterKiller(pods, session)
        seen = len(front.logged("front.continuing"))
        answer = await _stream(front.url, prompt, after=after, killer=killer)
        assert killer.killed is not None, f"{prompt!r}: not cut, {after} chunks never came"
        await killer.killed.router.start(session)
        await front.wait_ready(session)
        assert not answer.problems(), (prompt, after, answer.problems(), answer.raw[-300:])
        continuing = front.logged("front.continuing")[seen:]
        assert len(continuing) == 1 and continuing[0]["cut_pod"] == killer.killed.router.url, continuing
        partial = answer.text_before(continuing[0]["tokens_before"])
        assert whole.text.startswith(partial), (prompt, partial, whole.text)
        cuts.append(continuing[0]["tokens_before"])
        gaps.append(answer.gap_after(continuing[0]["tokens_before"]))
        at = _first_difference(whole.text, answer.text)
        if at is None:
            identical += 1
        else:
            distances.append(at - len(partial))
    elapsed = time.monotonic() - started

    summary = (
        f"identity: {identical} of {len(PROMPTS)} continued answers byte-identical to the uninterrupted one "
        f"({IDENTITY_TOKENS} tokens, cut after {cuts} tokens); the others first differ "
        f"{sorted(distances)} characters after the cut (median {statistics.median(distances) if distances else '-'}); "
        f"gap at the cut, client-side, p50 {_quantile(gaps, 0.5):.2f} s p99 {_quantile(gaps, 0.99):.2f} s; "
        f"{elapsed:.0f} s"
    )
    report.append(summary)
    print(summary)
