"""``drain-router-dev demo --front``: streams cut by a pod's roll, continued on the other pod by the
front in the same responses, on this machine with the package alone.

Two pods, each ``drain-router-dev fake-model`` behind a real ``drain-router serve`` whose grace
(``--termination-grace-secs 3``, no drain window) makes its in-flight deadline cut what is still
streaming 1 s after its SIGTERM; a real ``drain-router front --pods <both routers>``. The fake model's
answer is the sequence " t0 t1 t2 ..." that it resumes from any text ending in ``t<k>``, so the client
can check its answer against the uninterrupted one, and it numbers each leg's chunks from 0
(``seq``), so the client sees where a continuation joined.

Two runs of the same clients (:data:`TOKENS`-token completions, :data:`INTERVAL_MS` ms a token, each
longer than the deadline):

1. the control: straight to pod-0's router, SIGTERMed once every client has :data:`ROLL_AT` tokens;
   its deadline ends each stream with the honest error event;
2. through the front: pod-0 is the front's only ready pod when the clients start; once they stream,
   pod-1's router starts (the rollout's new pod) and, as a rollout does, pod-0's is SIGTERMed once the
   front sees pod-1 ready (at :data:`ROLL_AT` tokens at the earliest, :data:`ROLL_LATEST` at the
   latest); the front continues each cut stream on pod-1.

Each client's stream is shown as it arrives (redrawn on a terminal, event lines otherwise), and a
table compares the runs: completed, lost, continued (the front's own counter), the gap at the join
and whether each answer is the uninterrupted one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from drain_router_dev import cluster
from drain_router_dev import process as process_
from drain_router_dev.fake_model.openai import token_text
from drain_router_dev.load import percentile

CLIENTS = 4
TOKENS = 60
"""``max_tokens`` of every stream: 3 s at :data:`INTERVAL_MS`, longer than the routers' deadline."""
INTERVAL_MS = 50
"""The fake engine's time per token."""
ROLL_AT = 15
"""The pod is SIGTERMed once every client has this many tokens (0.75 s in) at the earliest: its
deadline cuts the streams mid-way."""
ROLL_LATEST = 30
"""Through the front, the pod is SIGTERMed once the front sees pod-1 ready, or at this many tokens
(1.5 s in) if pod-1 is slower to start: the deadline still cuts the streams (at 2.5 s, 10 tokens before
their end), and the front holds the continuations until pod-1 is ready."""
GRACE_SECS = 3
"""The routers' ``--termination-grace-secs``: their in-flight deadline is 2 s before it, 1 s after SIGTERM."""
DEADLINE_SECS = GRACE_SECS - 2
POLL_SECS = 0.2
"""The front's ``--poll-interval-secs`` (1 s as shipped): how soon it sees a pod ready."""
PROMPT = "Count:"
START_TIMEOUT_SECS = 20.0
STREAM_TIMEOUT_SECS = 30.0
EVENT_LINES = 8
"""Event lines under the streams in the redrawn view."""
HEAD, AROUND, TAIL = 3, 2, 2
"""Tokens a stream's line shows: its first, those on either side of a cut or join, its last."""


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    at: float
    """Seconds from the run's start."""
    text: str
    seq: int | None
    """The fake engine's chunk number: from 0 on each leg, so 0 again where a continuation joined."""


@dataclasses.dataclass(slots=True)
class Stream:
    """One client's response, filled in as it arrives (by its client alone)."""

    client: int
    status: int | None = None
    tokens: list[Token] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    """``data: [DONE]`` came."""
    error: str | None = None
    """The error event's ``type`` (the router's ``drain_deadline``), or the transport error."""
    ended: bool = False

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.done and self.finish_reason is not None and self.error is None


def uninterrupted(tokens: int) -> str:
    """The answer the fake engine gives in one go: `` t0 t1 ... t<tokens-1>``."""
    return "".join(token_text(k) for k in range(tokens))


def joins(stream: Stream) -> list[int]:
    """Where continuations joined: the indices of the tokens numbered 0 again (pure)."""
    return [i for i, token in enumerate(stream.tokens) if i and token.seq == 0]


def join_gaps_ms(stream: Stream) -> list[float]:
    """For each join, the time the client waited between the cut leg's last token and the
    continuation's first, in ms (pure)."""
    return [1000 * (stream.tokens[i].at - stream.tokens[i - 1].at) for i in joins(stream)]


def longest_gap_ms(stream: Stream) -> float | None:
    """The longest time between two of the stream's tokens, in ms (pure): a join slower than the
    engine's pace (:data:`INTERVAL_MS`) would show here."""
    ats = [token.at for token in stream.tokens]
    longest = max((b - a for a, b in itertools.pairwise(ats)), default=None)
    return None if longest is None else 1000 * longest


def _words(tokens: Sequence[Token], *, head: int, tail: int) -> str:
    """The first ``head`` and last ``tail`` of ``tokens``' texts, ``...`` for what is between."""
    words = [token.text.strip() for token in tokens]
    if len(words) <= head + tail + 1:
        return " ".join(words)
    return " ".join([*words[:head], "...", *words[len(words) - tail :]])


def line(stream: Stream, tokens: int, *, other: str) -> str:
    """A stream in one line (pure): its first tokens, a mark where it was cut (the error event) or
    where a continuation on ``other`` joined (with the gap before it), its last tokens, and at its end
    how it ended and whether its answer is the uninterrupted one."""
    legs: list[list[Token]] = []
    start = 0
    for at in [*joins(stream), len(stream.tokens)]:
        legs.append(stream.tokens[start:at])
        start = at
    parts: list[str] = []
    gaps = join_gaps_ms(stream)
    for n, leg in enumerate(legs):
        last = n == len(legs) - 1
        if n:
            parts.append(f"<cut; {other} joins after {gaps[n - 1]:.0f} ms>")
        parts.append(_words(leg, head=HEAD if n == 0 else AROUND, tail=TAIL if last else AROUND))
    text = "  ".join(part for part in parts if part)
    if stream.error is not None:
        text += f"  <cut: {stream.error}>"
    if not stream.ended:
        return f"client {stream.client}  {text}"
    if stream.completed:
        same = "the uninterrupted answer" if stream.text == uninterrupted(tokens) else "NOT the uninterrupted answer"
        end = f"[{stream.finish_reason}] [DONE]: {same}"
    else:
        end = f"lost ({len(stream.tokens)} of {tokens} tokens" + (")" if stream.done else ", no [DONE])")
    return f"client {stream.client}  {text}  {end}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One run's streams, ended."""

    label: str
    streams: tuple[Stream, ...]
    tokens: int
    continued: int | None
    """``drain_router_front_continuations_total{outcome="continued"}``; None without a front."""

    @property
    def completed(self) -> int:
        return sum(stream.completed for stream in self.streams)

    @property
    def lost(self) -> int:
        return len(self.streams) - self.completed

    @property
    def same_answer(self) -> int:
        whole = uninterrupted(self.tokens)
        return sum(stream.completed and stream.text == whole for stream in self.streams)

    @property
    def gaps_at_joins_ms(self) -> list[float]:
        """The gap at every join, in order."""
        return sorted(gap for stream in self.streams for gap in join_gaps_ms(stream))

    @property
    def longest_of_gaps_ms(self) -> float | None:
        """The longest gap between two tokens of any stream."""
        return max((g for stream in self.streams if (g := longest_gap_ms(stream)) is not None), default=None)


def table(runs: Sequence[Run]) -> str:
    """The runs side by side, one row a line (pure)."""

    def gaps(run: Run) -> str:
        p50, top = percentile(run.gaps_at_joins_ms, 0.5, ordered=True), max(run.gaps_at_joins_ms, default=None)
        return "-" if p50 is None or top is None else f"{p50:.0f} / {top:.0f} ms"

    def longest(run: Run) -> str:
        return "-" if run.longest_of_gaps_ms is None else f"{run.longest_of_gaps_ms:.0f} ms"

    rows: list[tuple[str, Callable[[Run], str]]] = [
        ("streams", lambda r: str(len(r.streams))),
        ("completed (finish_reason, [DONE])", lambda r: str(r.completed)),
        ("lost", lambda r: str(r.lost)),
        ('continued (front: outcome="continued")', lambda r: "-" if r.continued is None else str(r.continued)),
        ("gap at the join p50 / max", gaps),
        (f"longest gap between tokens ({INTERVAL_MS} ms a token)", longest),
        (f"answer = t0 ... t{runs[0].tokens - 1} uninterrupted", lambda r: f"{r.same_answer} of {len(r.streams)}"),
    ]
    cells = [[label, *(value(run) for run in runs)] for label, value in rows]
    head = ["", *(run.label for run in runs)]
    widths = [max(len(row[i]) for row in [head, *cells]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        return "  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))])

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *(fmt(row) for row in cells)])


class Display:
    """What the demo shows while a run goes on: on a terminal (``live``) a frame redrawn with rich, each
    client's line growing as its tokens arrive and the last events under them; otherwise one line
    per event as it happens and each client's line at the run's end."""

    def __init__(self, out: TextIO, *, live: bool, tokens: int) -> None:
        self.out = out
        self.live = live
        self.tokens = tokens
        self.title = ""
        self.other = ""
        self.streams: list[Stream] = []
        self.events: list[str] = []
        self.t0 = time.monotonic()
        self._live: Any = None

    def start(self, title: str, streams: list[Stream], *, other: str) -> None:
        self.title, self.streams, self.other = title, streams, other
        self.events = []
        self.t0 = time.monotonic()
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(get_renderable=self._frame, console=Console(file=self.out), refresh_per_second=10)
            self._live.start()
        else:
            self.out.write(f"\n== {title}\n")
            self.out.flush()

    def event(self, text: str) -> None:
        stamped = f"{time.monotonic() - self.t0:6.2f}s  {text}"
        self.events.append(stamped)
        if not self.live:
            self.out.write(stamped + "\n")
            self.out.flush()

    def lines(self) -> list[str]:
        return [line(stream, self.tokens, other=self.other) for stream in self.streams]

    def _frame(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        rows = [Text(f"== {self.title}", style="bold")]
        rows += [Text(text, no_wrap=True, overflow="ellipsis") for text in self.lines()]
        rows += [Text(text, style="dim") for text in self.events[-EVENT_LINES:]]
        return Group(*rows)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()  # its last frame stays on the terminal
            self._live = None
        else:
            self.out.write("".join(f"  {text}\n" for text in self.lines()))
            self.out.flush()


class Clients:
    """One run's streaming clients: each reads its completion into its :class:`Stream`; the run waits
    on their progress (:meth:`each_has`) and the display shows the cuts and joins as they come."""

    def __init__(self, count: int, display: Display) -> None:
        self.streams = [Stream(i + 1) for i in range(count)]
        self.display = display
        self._changed = asyncio.Condition()

    async def each_has(self, tokens: int) -> None:
        """Until every client has ``tokens`` tokens (or its stream ended)."""
        async with self._changed:
            await self._changed.wait_for(lambda: all(len(s.tokens) >= tokens or s.ended for s in self.streams))

    async def read(self, session: aiohttp.ClientSession, url: str) -> None:
        await asyncio.gather(*(self._one(session, url, stream) for stream in self.streams))

    async def _one(self, session: aiohttp.ClientSession, url: str, stream: Stream) -> None:
        body = {"model": "fake-model", "prompt": PROMPT, "stream": True, "max_tokens": self.display.tokens}
        timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_SECS)
        try:
            async with session.post(f"{url}/v1/completions", json=body, timeout=timeout) as resp:
                stream.status = resp.status
                async for raw in resp.content:
                    if raw.startswith(b"data:"):
                        await self._data(stream, raw[5:].strip())
        except (aiohttp.ClientError, TimeoutError) as exc:
            stream.error = stream.error or type(exc).__name__
        finally:
            stream.ended = True
            async with self._changed:
                self._changed.notify_all()

    async def _data(self, stream: Stream, data: bytes) -> None:
        if data == b"[DONE]":
            stream.done = True
            return
        chunk = json.loads(data)
        error = chunk.get("error")
        last = stream.tokens[-1].text.strip() if stream.tokens else "nothing"
        if isinstance(error, dict):
            stream.error = str(error.get("type"))
            self.display.event(f"client {stream.client}: cut after {last}, error event {stream.error}")
            return
        choice = chunk["choices"][0]
        seq = chunk.get("seq")
        token = Token(time.monotonic() - self.display.t0, choice.get("text", ""), seq)
        if stream.tokens and seq == 0:
            gap = 1000 * (token.at - stream.tokens[-1].at)
            self.display.event(
                f"client {stream.client}: cut after {last}, continued on {self.display.other} from "
                f"{token.text.strip()}, {gap:.0f} ms after {last}"
            )
        stream.tokens.append(token)
        stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
        async with self._changed:
            self._changed.notify_all()


def _sample(text: str, name: str, **labels: str) -> float:
    """One sample of an exposition, by name and labels (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


class Rig:
    """The processes: two pods (a fake model behind a router each) and the front, on loopback ports."""

    def __init__(self, log_dir: Path, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.models = [cluster.FakeModel(log_dir, interval_ms=INTERVAL_MS, name=f"model-{i}") for i in range(2)]
        self.pods = [
            cluster.Replica(f"pod-{i}", model.url, log_dir, shutdown_drain_secs=0, termination_grace_secs=GRACE_SECS)
            for i, model in enumerate(self.models)
        ]
        self.front_port, self.front_admin = process_.free_port(), process_.free_port()
        args = ["--admin-host", process_.LOOPBACK, "--admin-port", str(self.front_admin)]
        args += ["--pods", ",".join(pod.url for pod in self.pods), "--poll-interval-secs", str(POLL_SECS)]
        self.front = cluster.command_process(
            "front", log_dir, "front", self.front_port, *args, "--shutdown-drain-secs", "0"
        )

    async def start(self) -> None:
        """Both engines, pod-0's router and the front (pod-1's router starts in the front's run)."""
        self.front.start()
        await asyncio.gather(*(model.start(self.session) for model in self.models))
        await self.pods[0].start(self.session)
        admin = cluster.loopback_url(self.front_admin)
        await cluster.wait_http_ok(self.session, self.front, f"{admin}/readyz", START_TIMEOUT_SECS)

    async def front_logged(self, event: str, **fields: str) -> None:
        """Until the front logs ``event`` with ``fields`` (its log lines are JSON)."""

        def logged() -> bool:
            for text in self.front.new_lines():
                try:
                    entry = json.loads(text)
                except ValueError:
                    continue
                if entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items()):
                    return True
            if not self.front.alive:
                raise self.front.failed(f"exited before logging {event}")
            return False

        await process_.wait_until(logged, START_TIMEOUT_SECS, f"the front's {event} {fields}")

    async def front_metric(self, name: str, **labels: str) -> float:
        async with self.session.get(f"{cluster.loopback_url(self.front_admin)}/metrics") as resp:
            return _sample(await resp.text(), name, **labels)

    def kill(self) -> None:
        for proc in (self.front, *(pod.process for pod in self.pods), *(model.process for model in self.models)):
            proc.kill()


async def _roll(rig: Rig, clients: Clients, display: Display, *, new_pod: asyncio.Task[None] | None = None) -> None:
    """SIGTERM pod-0's router once every client has :data:`ROLL_AT` tokens and, with ``new_pod``, once
    that is done (the front sees pod-1 ready), as a rollout terminates the old pod once the new one is
    ready, but at :data:`ROLL_LATEST` tokens at the latest; then until it exits."""
    await clients.each_has(ROLL_AT)
    why = f"every client has {ROLL_AT} tokens"
    if new_pod is not None:
        latest = asyncio.ensure_future(clients.each_has(ROLL_LATEST))
        try:
            await asyncio.wait([new_pod, latest], return_when=asyncio.FIRST_COMPLETED)
        finally:
            latest.cancel()
        if new_pod.done():
            new_pod.result()  # its failure ends the demo
            why = f"pod-1 ready, every client past {ROLL_AT} tokens"
        else:
            why = f"every client has {ROLL_LATEST} tokens, pod-1 not ready yet (the front will hold the cut streams)"
    display.event(
        f"{why}: SIGTERM pod-0's router (grace {GRACE_SECS} s: it cuts what is still streaming {DEADLINE_SECS} s later)"
    )
    rig.pods[0].sigterm()
    code = await rig.pods[0].process.wait_exit(GRACE_SECS + 5)
    display.event(f"pod-0's router exited {code}")


async def control(rig: Rig, count: int, display: Display) -> Run:
    """The clients straight to pod-0's router, rolled."""
    clients = Clients(count, display)
    display.start("without the front: the clients straight to pod-0's router, rolled", clients.streams, other="")
    display.event(f"{count} clients stream /v1/completions ({TOKENS} tokens, {INTERVAL_MS} ms apart) to pod-0's router")
    try:
        await asyncio.gather(clients.read(rig.session, rig.pods[0].url), _roll(rig, clients, display))
    finally:
        display.stop()
    return Run(label="straight to pod-0", streams=tuple(clients.streams), tokens=TOKENS, continued=None)


async def through_front(rig: Rig, count: int, display: Display) -> Run:
    """The clients through the front: on pod-0, its only ready pod; pod-1 started, pod-0 rolled."""
    await rig.pods[0].start(rig.session)  # pod-0 back after the control run
    await process_.wait_until(
        lambda: rig.front_metric("drain_router_front_ready_pods"),
        START_TIMEOUT_SECS,
        "the front to see pod-0 ready",
        until=lambda ready: ready == 1,
    )
    clients = Clients(count, display)
    display.start("through the front: the same clients, the same roll", clients.streams, other="pod-1")
    display.event(f"{count} clients stream through the front to pod-0, its only ready pod")

    async def surge() -> None:
        await clients.each_has(1)
        display.event("every client is streaming on pod-0: pod-1's router starts (the rollout's new pod)")
        await rig.pods[1].start(rig.session)
        display.event("pod-1's router ready")
        await rig.front_logged("front.pod_ready", pod=rig.pods[1].url)
        display.event("the front sees pod-1 ready")

    new_pod = asyncio.ensure_future(surge())
    reading = clients.read(rig.session, cluster.loopback_url(rig.front_port))
    try:
        await asyncio.gather(reading, new_pod, _roll(rig, clients, display, new_pod=new_pod))
    finally:
        new_pod.cancel()
        display.stop()
    continued = await rig.front_metric("drain_router_front_continuations_total", outcome="continued")
    return Run(label="through the front", streams=tuple(clients.streams), tokens=TOKENS, continued=int(continued))


async def run(out: TextIO, *, clients: int = CLIENTS, live: bool = False) -> int:
    """The control, the run through the front, the table. Exits 1 if the front lost a stream or gave an
    answer other than the uninterrupted one."""
    out.write(
        f"Two pods (fake-model behind drain-router serve --termination-grace-secs {GRACE_SECS}: its deadline "
        f"cuts what streams {DEADLINE_SECS} s after SIGTERM) and drain-router front --pods <both>. "
        f"{clients} clients stream {TOKENS} tokens each ({TOKENS * INTERVAL_MS / 1000:g} s); pod-0 is rolled "
        "mid-way, once with the clients straight to its router, once through the front...\n"
    )
    out.flush()
    display = Display(out, live=live, tokens=TOKENS)
    with tempfile.TemporaryDirectory(prefix="drain-router-front-") as tmp:
        async with aiohttp.ClientSession() as session:
            rig = Rig(Path(tmp), session)
            try:
                await rig.start()
                runs = [await control(rig, clients, display), await through_front(rig, clients, display)]
            except (process_.ProcessFailed, TimeoutError) as exc:
                out.write(f"\ndemo failed: {exc}\n")
                return 1
            finally:
                rig.kill()
    out.write("\n" + table(runs) + "\n")
    front = runs[-1]
    if front.lost or front.same_answer < len(front.streams):
        out.write(f"\nThrough the front: {front.lost} stream(s) lost, {front.same_answer} answer(s) whole.\n")
    else:
        out.write(
            f"\nStraight to the router the roll lost {runs[0].lost} of {clients} streams (the error event "
            f"ends each); through the front every cut stream went on on pod-1 in the same response, and "
            f"every answer is t0 ... t{TOKENS - 1}, as if never cut.\n"
        )
    out.flush()
    return 1 if front.lost or front.same_answer < len(front.streams) else 0
