"""CPU time and memory of a process tree, through psutil (the machine-wide busy time too)."""

from __future__ import annotations

import psutil


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (nginx's workers, a wrapper's child), alive right now."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def _each(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds consumed so far by these processes (all their threads)."""
    total = 0.0
    for proc in _each(pids):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def rss_kib(pids: list[int]) -> int:
    """Resident set size in KiB, summed over the processes (shared pages count once per process)."""
    total = 0
    for proc in _each(pids):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total // 1024


def machine_busy_seconds() -> float:
    """CPU seconds all processes on the machine have used (everything but idle and iowait)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


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
        if not self.root_pid or not psutil.pid_exists(self.root_pid):
            return None
        return cpu_seconds(self.pids) - self.cpu0

    def rss(self) -> int:
        return rss_kib(tree(self.root_pid)) if self.root_pid else 0
