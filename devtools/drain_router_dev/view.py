"""The demo's live view: a frame redrawn with rich on a terminal, plain event lines otherwise.

Only :mod:`drain_router_dev.demo` imports this, and only when the demo runs: rich (the ``demo``
extra) never loads in a serving router.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TextIO

EVENT_LINES = 6


@dataclasses.dataclass(slots=True)
class ReplicaView:
    state: str = "starting"
    inflight: int = 0
    in_rotation: bool = False
    """In the balancer's rotation (from its readiness probes), not the pod's own state."""


class View:
    """What the demo shows while a run goes on. ``live``: a rich frame (falls back to plain lines
    when rich is not installed); otherwise one line per event."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.title = ""
        self.step = ""
        self.progress = 0.0
        self.replicas: dict[str, ReplicaView] = {}
        self.done = 0
        self.lost = 0
        self.sessions: str | None = None
        """The realtime sessions' line (open, ended 1001, cut), when the run holds sessions."""
        self.grpc: str | None = None
        """The gRPC calls' line (done, lost), when the run makes gRPC calls."""
        self.events: list[str] = []
        self._run_started = time.monotonic()
        self._live: Any = None
        self._console: Any = None
        if live:
            try:
                from rich.console import Console
            except ImportError:
                out.write("(no live view: rich is not installed; pip install ./devtools)\n")
            else:
                self._console = Console(file=out)
        self.live = self._console is not None

    def start_run(self, title: str, replicas: list[str], started: float) -> None:
        self.title = title
        self.replicas = {name: ReplicaView() for name in replicas}
        self.done = self.lost = 0
        self.events = []
        self._run_started = started
        if self.live:
            from rich.live import Live

            self._live = Live(self._frame(), console=self._console, auto_refresh=False, transient=False)
            self._live.start()
        else:
            self.out.write(f"\n== {title}\n")
            self.out.flush()

    def event(self, text: str) -> None:
        line = f"{time.monotonic() - self._run_started:6.1f}s  {text}"
        self.events = [*self.events, line][-EVENT_LINES:]
        if not self.live:
            self.out.write(line + "\n")
            self.out.flush()

    def draw(self) -> None:
        if self._live is not None:
            self._live.update(self._frame(), refresh=True)

    def end_run(self) -> None:
        if self._live is not None:
            self._live.update(self._frame(), refresh=True)
            self._live.stop()  # the last frame stays on screen
            self._live = None
        self.out.write("\n" if self.live else "")
        self.out.flush()

    def close(self) -> None:
        """Stop a live frame at once (the demo failed)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _frame(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, pad_edge=False, show_edge=False)
        table.add_column("pod")
        table.add_column("state")
        table.add_column("in-flight", justify="right")
        table.add_column("balancer rotation (its probes)")
        for name, rv in self.replicas.items():
            rotation = Text("in rotation", style="green") if rv.in_rotation else Text("out", style="red")
            table.add_row(name, rv.state, str(rv.inflight), rotation)
        lost = Text(f"{self.lost} lost", style="bold red" if self.lost else "green")
        progress = Table.grid(padding=(0, 1))
        progress.add_row(
            ProgressBar(total=1.0, completed=self.progress, width=32), Text(f"{self.progress * 100:3.0f}%  {self.step}")
        )
        return Group(
            Text(self.title, style="bold"),
            progress,
            Text(""),
            table,
            Text.assemble(f"requests: {self.done} done, ", lost),
            *([Text(f"realtime sessions: {self.sessions}")] if self.sessions is not None else []),
            *([Text(f"gRPC calls: {self.grpc}")] if self.grpc is not None else []),
            Text(""),
            *[Text(f" {line}", style="dim") for line in self.events],
        )
