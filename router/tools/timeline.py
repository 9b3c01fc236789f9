"""The demo's PNG timeline (needs the ``plot`` extra, matplotlib): one panel pair per run.

Top of each pair: in-flight requests per replica over time, SIGTERM (dashed) and closing (dotted)
marks, lost requests as red crosses at the moment they failed. Below it: when the balancer had
each replica in rotation (its readiness view).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.tools import runs

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install 'drain-router[demo]'``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    start: float
    end: float


def rotation_spans(changes: list[tuple[float, str, bool]], replica: str, end: float) -> list[Span]:
    """Intervals during which ``replica`` was in rotation, from the balancer's flips. Pure."""
    spans: list[Span] = []
    since: float | None = None
    for t, name, up in sorted(changes):
        if name != replica:
            continue
        if up and since is None:
            since = t
        elif not up and since is not None:
            spans.append(Span(since, t))
            since = None
    if since is not None:
        spans.append(Span(since, end))
    return spans


def plot(runs: list[runs.RunResult], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PlotUnavailable(str(exc)) from None

    fig = plt.figure(figsize=(11, 3.6 * len(runs) + 0.4), dpi=110)
    grid = fig.add_gridspec(3 * len(runs), 1, height_ratios=[3.2, 1, 0.55] * len(runs), hspace=0.1)
    ymax = max([s.inflight for run in runs for s in run.samples] + [1]) * 1.25
    for index, run in enumerate(runs):
        ax = fig.add_subplot(grid[3 * index])
        rot = fig.add_subplot(grid[3 * index + 1], sharex=ax)
        _plot_run(ax, rot, run, ymax)
        if index == 0:
            ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=3, frameon=False)
    fig.suptitle("drain-router demo: rolling restart behind a probe-driven balancer", fontsize=12, y=0.995)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _plot_run(ax: Any, rot: Any, run: runs.RunResult, ymax: float) -> None:
    lost = [r for r in run.records if r.outcome.lost]
    ax.set_title(
        f"{run.label} (--shutdown-drain-secs {run.drain_secs}): {len(run.records)} requests, {len(lost)} lost",
        fontsize=10,
        loc="left",
    )
    for i, name in enumerate(run.replicas):
        color = COLORS[i % len(COLORS)]
        points = [(s.t, s.inflight) for s in run.samples if s.replica == name]
        if points:
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", color=color, lw=2.2 - 0.6 * i, label=f"{name} in-flight")
        for mark in run.marks:
            if mark.replica != name:
                continue
            if mark.kind == "sigterm":
                ax.axvline(mark.t, color=color, ls="--", lw=1)
                ax.text(mark.t, ymax * 0.97, " SIGTERM", color=color, fontsize=7, va="top", rotation=90)
            elif mark.kind == "closing":
                ax.axvline(mark.t, color=color, ls=":", lw=1.4)
                ax.text(mark.t, ymax * 0.55, " closing", color=color, fontsize=7, va="top", rotation=90)
    if lost:
        ax.scatter(
            [r.finished for r in lost],
            [ymax * 0.06] * len(lost),
            marker="x",
            color="#d62728",
            s=36,
            zorder=5,
            label=f"lost ({len(lost)})",
        )
    else:
        ax.plot([], [], "x", color="#d62728", label="lost (0)")
    ax.set_ylim(0, ymax)
    ax.set_ylabel("in flight")
    ax.grid(alpha=0.25)
    ax.tick_params(labelbottom=False)
    for i, name in enumerate(run.replicas):
        spans = rotation_spans(run.rotation, name, run.duration)
        rot.broken_barh(
            [(s.start, s.end - s.start) for s in spans], (i - 0.35, 0.7), color=COLORS[i % len(COLORS)], alpha=0.75
        )
    rot.set_yticks(range(len(run.replicas)), [f"{n} ready" for n in run.replicas], fontsize=8)
    rot.set_ylim(-0.6, len(run.replicas) - 0.4)
    rot.set_xlim(0, run.duration)
    rot.set_xlabel("seconds", fontsize=8)
    rot.grid(axis="x", alpha=0.25)
