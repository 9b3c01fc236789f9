"""The demo's PNG timeline (needs the ``demo`` extra, matplotlib): three lanes per run, one x axis.

Per run, top to bottom: in-flight requests per pod (what the balancer has open to it), with the
termination start (dashed) and listener close (dotted) of each pod; every lost request as one dot
at the moment it failed (dots in the same 50 ms stack up, so N losses are N dots); and when the
balancer had each pod in rotation, from its readiness probes. The run's title says how many of its
requests were lost, in red, or 0 in green.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drain_router_dev import runs

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
LOST_COLOR = "#d62728"
OK_COLOR = "#2ca02c"
#: Lost requests that failed within this many seconds of each other stack in one column.
LOSS_BIN_SECS = 0.05


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install ./devtools``)."""


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


def loss_dots(times: list[float], bin_secs: float = LOSS_BIN_SECS) -> list[tuple[float, int]]:
    """One ``(x, height)`` per lost request: its time, and 1, 2, 3... for requests lost in the same
    bin, so every loss is its own dot and none hides another. Pure."""
    dots: list[tuple[float, int]] = []
    heights: dict[int, int] = {}
    for t in sorted(times):
        column = round(t / bin_secs)
        heights[column] = heights.get(column, 0) + 1
        dots.append((t, heights[column]))
    return dots


def plot(results: list[runs.RunResult], path: Path) -> Path:
    fig = figure(results)
    fig.savefig(path, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def figure(results: list[runs.RunResult]) -> Any:
    """The matplotlib figure of :func:`plot` (its axes in order: in-flight, lost, rotation per run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PlotUnavailable(str(exc)) from None

    fig = plt.figure(figsize=(11, 4.3 * len(results) + 0.6), dpi=110)
    grid = fig.add_gridspec(
        4 * len(results), 1, height_ratios=[2.6, 1.0, 0.8, 0.75] * len(results), hspace=0.12, top=0.955, bottom=0.03
    )
    ymax = max([s.inflight for run in results for s in run.samples] + [1]) * 1.2
    lost_max = max([h for run in results for _, h in loss_dots([r.finished for r in run.lost])] + [1])
    xmax = max([run.duration for run in results] + [1.0])
    first: Any = None
    for index, run in enumerate(results):
        ax = fig.add_subplot(grid[4 * index], sharex=first)
        first = first or ax
        lost_ax = fig.add_subplot(grid[4 * index + 1], sharex=first)
        rot = fig.add_subplot(grid[4 * index + 2], sharex=first)
        _inflight(ax, run, ymax)
        _losses(lost_ax, run, lost_max)
        _rotation(rot, run)
        for axis in (ax, lost_ax):
            axis.tick_params(labelbottom=False)
    first.set_xlim(0, xmax)
    fig.suptitle(
        "drain-router-dev demo: the same rolling restart under each recipe, behind a probe-driven balancer",
        fontsize=12,
        y=0.995,
    )
    return fig


def _inflight(ax: Any, run: runs.RunResult, ymax: float) -> None:
    lost = len(run.lost)
    ax.set_title(f"{run.label}   ({run.setting})", fontsize=10, loc="left")
    ax.set_title(
        f"{lost} of {len(run.records)} lost",
        fontsize=13,
        loc="right",
        color=LOST_COLOR if lost else OK_COLOR,
        fontweight="bold",
    )
    for i, name in enumerate(run.replicas):
        color = COLORS[i % len(COLORS)]
        points = [(s.t, s.inflight) for s in run.samples if s.replica == name]
        if points:
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", color=color, lw=2.4 - 0.8 * i, label=f"{name} in flight")
        for mark in run.marks:
            if mark.replica == name and mark.kind == "sigterm":
                ax.axvline(mark.t, color=color, ls="--", lw=1.1)
            elif mark.replica == name and mark.kind == "closing":
                ax.axvline(mark.t, color=color, ls=":", lw=1.6)
    ax.plot([], [], color="grey", ls="--", lw=1.1, label=run.t0_name)
    ax.plot([], [], color="grey", ls=":", lw=1.6, label=f"{run.closing_name} (listener closed)")
    ax.legend(loc="upper left", fontsize=7.5, ncol=4, frameon=False)
    ax.set_ylim(0, ymax * 1.25)  # headroom for the legend
    ax.set_ylabel("in flight", fontsize=8)
    ax.grid(alpha=0.25)


def _losses(ax: Any, run: runs.RunResult, lost_max: int) -> None:
    dots = loss_dots([r.finished for r in run.lost])
    if dots:
        xs, hs = zip(*dots)
        ax.scatter(xs, hs, s=14, color=LOST_COLOR, marker="o", linewidths=0, zorder=3)
    else:
        ax.text(0.5, 0.5, "no request lost", transform=ax.transAxes, ha="center", va="center", color=OK_COLOR)
    ax.set_ylim(0, lost_max + 1)
    ax.set_yticks([])
    label = f"lost: {len(run.lost)}\n(a dot each)" if dots else "lost: 0"
    ax.set_ylabel(label, fontsize=8, color=LOST_COLOR if dots else OK_COLOR, rotation=0, ha="right", va="center")
    ax.grid(axis="x", alpha=0.25)


def _rotation(ax: Any, run: runs.RunResult) -> None:
    for i, name in enumerate(run.replicas):
        spans = rotation_spans(run.rotation, name, run.duration)
        ax.broken_barh([(s.start, s.end - s.start) for s in spans], (i - 0.35, 0.7), color=COLORS[i % len(COLORS)])
    ax.set_yticks(range(len(run.replicas)), [f"{n}" for n in run.replicas], fontsize=7)
    ax.set_ylim(-0.6, len(run.replicas) - 0.4)
    label = f"in balancer rotation\n(probes {run.probe_name})"
    ax.set_ylabel(label, fontsize=7.5, rotation=0, ha="right", va="center")
    ax.set_xlabel("seconds since the run started", fontsize=8)
    ax.grid(axis="x", alpha=0.25)
