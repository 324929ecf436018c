"""Sampling profiles of a running service with py-spy, summarised as the top costs.

py-spy attaches from outside (ptrace), so the service runs unmodified; the summary counts
each function once per sample it appears in (inclusive) and when it is the leaf (self).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# 100 Hz is py-spy's default: enough samples in a 10-20 s burst, little CPU on a 2-core box.
RATE_HZ = 100
TOP = 15


def py_spy() -> str | None:
    return shutil.which("py-spy") or (str(p) if (p := Path(sys.executable).with_name("py-spy"))
                                      .exists() else None)


@contextmanager
def recording(pid: int, out: Path) -> Iterator[None]:
    """Sample ``pid`` while the block runs; collapsed stacks go to ``out``."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install 'py-spy>=0.3')")
    # --gil: only samples holding the GIL, i.e. Python on a CPU, not a loop waiting in epoll.
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--gil",
                             "--rate", str(RATE_HZ), "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _frame(frame: str) -> str:
    # "function (path/to/module.py:123)" → "function (module.py)"
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else name


def _path(frame: str) -> str:
    return frame.partition(" (")[2].rstrip(")").rsplit(":", 1)[0]


def _ours(frame: str) -> bool:
    # py-spy prints paths relative to sys.path: "agentledger/admission/admitter.py".
    return _path(frame).startswith("agentledger/") or "/agentledger/" in _path(frame)


def _package(frame: str) -> str:
    path = _path(frame)
    if path.startswith("<"):
        return "python (frozen)"
    top = path.split("/", 1)[0] if "/" in path else "python stdlib"
    return "python stdlib" if top in {"asyncio", "concurrent", "json", "logging"} else top


def summarise(collapsed: str, top: int = TOP) -> dict[str, object]:
    """Top functions by self share of samples, and our own functions by inclusive share."""
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        raw = stack.split(";")
        total += n
        own[_frame(raw[-1])] += n
        packages[_package(raw[-1])] += n
        for f in {_frame(f) for f in raw if _ours(f)}:
            inclusive[f] += n
    share = (lambda c: round(100.0 * c / total, 1)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "self_pct": [[f, share(c)] for f, c in own.most_common(top)],
        "self_by_package_pct": [[p, share(c)] for p, c in packages.most_common(top)],
        "ours_inclusive_pct": [[f, share(c)] for f, c in inclusive.most_common(top)],
    }
