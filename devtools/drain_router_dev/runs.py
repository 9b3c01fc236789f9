"""What one demo run recorded, and the pure summaries of runs: shared by the demo's live run
(:mod:`drain_router_dev.demo`) and its PNG timeline (:mod:`drain_router_dev.timeline`), which import this
module and not each other."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from drain_router_dev import load, realtime

if TYPE_CHECKING:  # grpcio (the devtools distribution's dependencies) loads only when a run makes gRPC calls
    from drain_router_dev import grpc_load


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    t: float
    replica: str
    state: str
    inflight: int


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    t: float
    replica: str
    kind: str
    """``sigterm``, ``draining``, ``closing``, ``exited``, ``serving``..."""


@dataclasses.dataclass(slots=True)
class RunResult:
    label: str
    """The recipe: ``drain-router``, ``sleep + engine drain``, ``sleep (probe-only LB)``, ``no drain``."""
    setting: str
    """Its windows, e.g. ``--shutdown-drain-secs 2`` or ``preStop sleep 1 s, --shutdown-timeout 3 s``."""
    replicas: list[str]
    duration: float = 0.0
    records: list[load.Record] = dataclasses.field(default_factory=list)
    samples: list[Sample] = dataclasses.field(default_factory=list)
    marks: list[Mark] = dataclasses.field(default_factory=list)
    rotation: list[tuple[float, str, bool]] = dataclasses.field(default_factory=list)
    drain_durations: list[float] = dataclasses.field(default_factory=list)
    exit_codes: list[int] = dataclasses.field(default_factory=list)
    balancer_errors: Counter[str] = dataclasses.field(default_factory=Counter)
    """Why the balancer answered 502 or cut a stream, by exception type."""
    note: str = ""
    """How the setting was derived, for the table's footnotes."""
    t0_name: str = "SIGTERM"
    """What starts a pod's termination in this recipe (the ``sigterm`` marks)."""
    closing_name: str = "closing"
    """What closes its listener (the ``closing`` marks)."""
    probe_name: str = "router /readyz"
    """What the balancer's readiness probe asks."""
    sessions: list[realtime.Record] = dataclasses.field(default_factory=list)
    """The realtime (WebSocket) sessions held beside the streams; empty when the router does not
    tunnel WebSocket yet (then the demo leaves them out of every run)."""
    grpc: list[grpc_load.Record] = dataclasses.field(default_factory=list)
    """The gRPC ``Generate`` calls made beside the streams; empty without gRPC clients."""

    @property
    def lost(self) -> list[load.Record]:
        return [r for r in self.records if r.outcome.lost]

    @property
    def grpc_lost(self) -> list[grpc_load.Record]:
        return [r for r in self.grpc if r.outcome.lost]


def closing_times(log_path: Path, wall_started: float) -> list[float]:
    """Seconds since ``wall_started`` of each ``drain.closing`` event in a router's JSON log."""
    times: list[float] = []
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return times
    for line in lines:
        try:
            event = json.loads(line)
            if event.get("event") == "drain.closing":
                times.append(datetime.datetime.fromisoformat(event["timestamp"]).timestamp() - wall_started)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return times


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def comparison_table(runs: list[RunResult]) -> str:
    """The end-of-demo table, as text. Pure."""
    headers = ["", *[r.label for r in runs]]
    rows: list[list[str]] = [
        ["requests", *[str(len(r.records)) for r in runs]],
        ["lost", *[str(len(r.lost)) for r in runs]],
        [
            "p50 completion",
            *[_secs(load.percentile([x.duration for x in r.records if not x.outcome.lost], 0.5)) for r in runs],
        ],
        [
            "p99 completion",
            *[_secs(load.percentile([x.duration for x in r.records if not x.outcome.lost], 0.99)) for r in runs],
        ],
        *(_session_rows(runs) if any(r.sessions for r in runs) else []),
        *(_grpc_rows(runs) if any(r.grpc for r in runs) else []),
        [
            "SIGTERM to exit",
            *[_secs(sum(r.drain_durations) / len(r.drain_durations)) if r.drain_durations else "-" for r in runs],
        ],
    ]
    notes: list[str] = []
    for run in runs:
        why = _lost_kinds(run)
        if why:
            if run.balancer_errors:
                why += " (balancer: " + ", ".join(f"{k} x{n}" for k, n in run.balancer_errors.most_common()) + ")"
            notes.append(f"lost in {run.label}: {why}")
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join([row[0].ljust(widths[0]), *[c.rjust(w) for c, w in zip(row[1:], widths[1:])]]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    settings = [f"{run.label}: {run.setting}" + (f" ({run.note})" if run.note else "") for run in runs]
    return "\n".join([fmt(headers), rule, *[fmt(r) for r in rows], "", *settings, *(["", *notes] if notes else [])])


def _lost_kinds(run: RunResult) -> str:
    """How the run's requests were lost, e.g. ``502 x30, cut x1``; empty when none was. Pure."""
    kinds = Counter(f"{x.status}" if x.outcome.value == "http_error" else x.outcome.value for x in run.lost)
    return ", ".join(f"{k} x{n}" for k, n in kinds.most_common())


def _cut(run: RunResult) -> int:
    """Realtime sessions that ended neither 1000 nor 1001."""
    return sum(1 for s in run.sessions if not s.end.clean)


def _session_rows(runs: list[RunResult]) -> list[list[str]]:
    """Realtime sessions: how many, how many ended with a Close 1001 (told to reconnect), and how
    many did not end with 1000 or 1001 (cut: 1006, a reset, a failed handshake). Pure."""

    def count(run: RunResult, going_away: bool | None) -> str:
        if going_away is None:
            return str(sum(1 for s in run.sessions if not s.end.clean))
        return str(sum(1 for s in run.sessions if s.end.reconnect))

    return [
        ["realtime sessions", *[str(len(r.sessions)) for r in runs]],
        ["sessions ended 1001", *[count(r, True) for r in runs]],
        ["sessions cut", *[count(r, None) for r in runs]],
    ]


def _grpc_rows(runs: list[RunResult]) -> list[list[str]]:
    """gRPC calls: how many, how many lost (a status other than OK, or tokens missing). Pure."""
    return [
        ["gRPC calls", *[str(len(r.grpc)) for r in runs]],
        ["gRPC calls lost", *[str(len(r.grpc_lost)) for r in runs]],
    ]


def _grpc_lost_kinds(run: RunResult) -> str:
    """How the run's gRPC calls were lost, by status, e.g. ``UNAVAILABLE x4``. Pure."""
    return ", ".join(f"{k} x{n}" for k, n in Counter(r.code for r in run.grpc_lost).most_common())


#: Within this ratio two figures count as the same in :func:`summary` (run-to-run noise).
SAME = 1.05


def _p99(run: RunResult) -> float | None:
    return load.percentile([x.duration for x in run.records if not x.outcome.lost], 0.99)


def _exit(run: RunResult) -> float | None:
    return sum(run.drain_durations) / len(run.drain_durations) if run.drain_durations else None


def summary(results: list[RunResult]) -> str:
    """What the runs showed, the first (drain-router) against the others, in words: what each run
    lost, each run that lost more than the first (requests, realtime sessions cut, gRPC calls), then each
    figure on which others did as well or better, with theirs. Pure."""
    first, others = results[0], results[1:]
    lines = []
    for run in results:
        line = f"{run.label}: {len(run.lost)} of {len(run.records)} requests lost"
        if run.lost:
            line += f" ({_lost_kinds(run)})"
        if run.sessions:
            line += f"; {_cut(run)} of {len(run.sessions)} realtime sessions cut"
        if run.grpc:
            line += f"; {len(run.grpc_lost)} of {len(run.grpc)} gRPC calls lost"
            if run.grpc_lost:
                line += f" ({_grpc_lost_kinds(run)})"
        lines.append(line + ".")
    for other in others:
        if len(other.lost) > len(first.lost):
            lines.append(
                f"{first.label} lost fewer requests than {other.label}: {len(first.lost)} against {len(other.lost)}."
            )
        if first.sessions and other.sessions and _cut(other) > _cut(first):
            lines.append(
                f"{first.label} cut fewer realtime sessions than {other.label}: {_cut(first)} against {_cut(other)}."
            )
        if first.grpc and other.grpc and len(other.grpc_lost) > len(first.grpc_lost):
            lines.append(
                f"{first.label} lost fewer gRPC calls than {other.label}: "
                f"{len(first.grpc_lost)} against {len(other.grpc_lost)}."
            )
    # Each figure on which another run did as well or better, on one line with every such run.
    as_good = [
        (f"lost no more requests ({len(first.lost)})", [o.label for o in others if len(o.lost) <= len(first.lost)]),
        (f"p99 completion ({first.label} {_secs(_p99(first))})", _no_worse(first, others, _p99)),
        (
            f"SIGTERM to exit ({first.label} {_secs(_exit(first))}: it holds each pod for its whole drain window)",
            _no_worse(first, others, _exit),
        ),
    ]
    if any(runs for _, runs in as_good):
        lines.append(f"As good as {first.label} or better in this run:")
        lines += [f"  {figure}: {', '.join(runs)}." for figure, runs in as_good if runs]
    return "\n".join(lines)


def _no_worse(first: RunResult, others: list[RunResult], figure: Callable[[RunResult], float | None]) -> list[str]:
    """``label figure`` of each other run whose figure is within :data:`SAME` of the first's or lower."""
    mine = figure(first)
    if mine is None:
        return []
    found = []
    for other in others:
        theirs = figure(other)
        if theirs is not None and theirs <= mine * SAME:
            found.append(f"{other.label} {_secs(theirs)}")
    return found
