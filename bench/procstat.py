"""CPU time and memory of a process tree, read from /proc (Linux only). No I/O besides /proc reads."""

from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (nginx's workers, a wrapper's child), alive right now."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        if not os.path.exists(f"/proc/{current}"):
            continue
        out.append(current)
        try:
            for tid in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{tid}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds consumed so far by these processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / CLOCK_TICKS


def rss_kib(pids: list[int]) -> int:
    """Resident set size in KiB, summed over the processes (shared pages count once per process)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE_KIB
        except OSError:
            continue
    return total


class Meter:
    """CPU seconds used by a process tree between ``start()`` and ``stop()``."""

    def __init__(self, root_pid: int | None) -> None:
        self.root_pid = root_pid
        self.pids: list[int] = []
        self.cpu0 = 0.0

    def start(self) -> None:
        self.pids = tree(self.root_pid) if self.root_pid else []
        self.cpu0 = cpu_seconds(self.pids)

    def stop(self) -> float | None:
        """CPU seconds since ``start()``; None when the root process has gone (its figure is lost)."""
        if not self.root_pid or not os.path.exists(f"/proc/{self.root_pid}/stat"):
            return None
        return cpu_seconds(self.pids) - self.cpu0

    def rss(self) -> int:
        return rss_kib(tree(self.root_pid)) if self.root_pid else 0
