"""CPU seconds and peak resident memory of the processes under test (psutil and /proc)."""

from __future__ import annotations

from pathlib import Path

import psutil


def peak_rss_mb(pid: int) -> float | None:
    """The kernel's high-water mark of resident memory (VmHWM), in MiB; None once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far; None once gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def child_pid(module: str) -> int | None:
    """The newest live child of this process running ``python -m module``."""
    found = [c for c in psutil.Process().children(recursive=True)
             if _cmdline(c)[-2:] == ["-m", module]]
    return max(found, key=lambda c: c.create_time()).pid if found else None


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except psutil.Error:
        return []


class Group:
    """Named processes whose CPU is compared across a phase and whose peak RSS is read."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)

    def cpu(self) -> dict[str, float]:
        return {n: c for n, p in self.pids.items() if (c := cpu_seconds(p)) is not None}

    def peak_rss(self) -> dict[str, float | None]:
        return {n: peak_rss_mb(p) for n, p in self.pids.items()}


def cpu_per_1000(before: dict[str, float], after: dict[str, float], commands: int,
                 names: list[str] | None = None) -> float | None:
    """CPU seconds spent by ``names`` (default all) between two snapshots, per 1,000 commands."""
    if commands <= 0:
        return None
    keys = [n for n in (names or list(after)) if n in before and n in after]
    spent = sum(after[n] - before[n] for n in keys)
    return round(spent / commands * 1000, 2)
