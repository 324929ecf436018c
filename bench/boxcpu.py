"""Whole-box and per-process CPU, and who a Postgres process works for. Pure: no I/O.

The figures come from the kernel's own counters, read by :mod:`bench.meter`:

- the box: the aggregate ``cpu`` line of ``/proc/stat`` (every process and the kernel's own
  threads; ticks of ``1/CLK_TCK`` s), busy = user + nice + system + irq + softirq (iowait and
  steal are time the CPU was *not* running anything of this box);
- a multi-threaded process (our services, the broker's JVM, the CRM stand-in, the load
  generator): ``utime + stime`` of ``/proc/<pid>/stat``, the whole thread group, in ticks;
- a Postgres process (one thread each): ``/proc/<pid>/schedstat``'s time on CPU, in ns, so
  the many backends of a burst do not each add a tick of rounding.

A Postgres process works for the database its ``pg_stat_activity`` row names, apart from the
bench's own connections (marked by ``application_name``) and the cluster's background
processes (checkpointer, WAL writer, launchers: no database).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The /proc/stat fields that are the CPU doing work for someone on this box.
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
                "guest", "guest_nice")
# application_name of the bench's own Postgres connections (completion polling, the meter).
BENCH_APP_PREFIX = "agentledger-bench"
# Postgres backend types that run a database's own statements (a parallel worker runs part
# of a client's query).
_CLIENT_TYPES = frozenset({"client backend", "parallel worker"})
_SHORT_TYPES = {"walsender": "walsender", "autovacuum worker": "autovacuum"}
_DIGITS = re.compile(r"\d+")


def parse_proc_stat(text: str) -> dict[str, int]:
    """The aggregate ``cpu`` line of ``/proc/stat``: field name → ticks."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            return dict(zip(_STAT_FIELDS, (int(v) for v in parts[1:]), strict=False))
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_ticks(fields: Mapping[str, int]) -> int:
    """Ticks the box's CPUs spent running something (see :data:`BUSY_FIELDS`)."""
    return sum(fields.get(name, 0) for name in BUSY_FIELDS)


@dataclass(frozen=True)
class PidStat:
    """What ``/proc/<pid>/stat`` says of a process: its CPU and when it started."""

    ppid: int
    cpu_ticks: int  # utime + stime: every thread of the process, exited threads included
    children_ticks: int  # cutime + cstime: children it has reaped (a postmaster's backends)
    start_ticks: int  # since boot


def parse_pid_stat(text: str) -> PidStat:
    """Parse ``/proc/<pid>/stat`` (the command name may hold spaces and parentheses)."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    return PidStat(ppid=int(rest[1]), cpu_ticks=int(rest[11]) + int(rest[12]),
                   children_ticks=int(rest[13]) + int(rest[14]), start_ticks=int(rest[19]))


def parse_comm(text: str) -> str:
    """The command (or thread) name of ``/proc/<pid>/stat``."""
    return text[text.index("(") + 1:text.rindex(")")]


def thread_group(comm: str) -> str:
    """A thread's name with its numbers folded (``GC Thread#3`` → ``GC Thread#N``), so a
    pool of threads is one line (names are cut to 15 characters by the kernel)."""
    return _DIGITS.sub("N", comm.strip())


def parse_schedstat(text: str) -> int:
    """Nanoseconds on CPU from ``/proc/<pid>/schedstat`` (of the task: one thread)."""
    return int(text.split()[0])


@dataclass(frozen=True)
class Backend:
    """One row of ``pg_stat_activity``."""

    pid: int
    datname: str | None
    backend_type: str
    application_name: str = ""


def pg_group(backend: Backend, roles: Mapping[str, str]) -> str:
    """The group a Postgres process's CPU counts in.

    ``roles`` maps a database name to its role in the phase (``ledger``, ``crm``,
    ``peer_app``...). A client of a role's database counts as the role; its walsender and
    autovacuum workers as ``<role>:walsender`` and ``<role>:autovacuum`` (decoding and
    vacuuming that database's changes); the bench's own connections as ``bench``; processes
    with no database as ``background``; any other database as ``other_databases``.
    """
    if backend.application_name.startswith(BENCH_APP_PREFIX):
        return "bench"
    if backend.datname is None:
        return "background"
    role = roles.get(backend.datname)
    if role is None:
        return "other_databases"
    if backend.backend_type in _CLIENT_TYPES:
        return role
    return f"{role}:{_SHORT_TYPES.get(backend.backend_type, backend.backend_type)}"


@dataclass
class PidTracker:
    """CPU of processes seen over a window, by group, from repeated observations.

    A process is known by (pid, start time), so a reused pid is a new process. Its CPU in
    the window is its last observation minus its first; one that started after the window
    opened started from 0. A process that exits between two observations keeps what was
    seen of it: the rest is the difference between the cluster's total and the groups'.
    """

    window_start_ticks: int  # since boot, as in PidStat.start_ticks
    first: dict[tuple[int, int], int] = field(default_factory=dict)
    last: dict[tuple[int, int], int] = field(default_factory=dict)
    group: dict[tuple[int, int], str] = field(default_factory=dict)

    def observe(self, pid: int, start_ticks: int, cpu: int, group: str | None) -> None:
        """One reading of a process's CPU (any unit, the same for every call)."""
        key = (pid, start_ticks)
        if key not in self.first:
            self.first[key] = 0 if start_ticks > self.window_start_ticks else cpu
        self.last[key] = cpu
        if group is not None:
            self.group[key] = group

    def by_group(self, unknown: str = "unattributed") -> dict[str, int]:
        """CPU in the window per group (processes never given a group count as ``unknown``)."""
        out: dict[str, int] = {}
        for key, cpu in self.last.items():
            name = self.group.get(key, unknown)
            out[name] = out.get(name, 0) + max(0, cpu - self.first[key])
        return out


def ms_per_cmd(ms: float | None, commands: int) -> float | None:
    """CPU-ms per command, 3 places; None when either is unknown."""
    if ms is None or commands <= 0:
        return None
    return round(ms / commands, 3)


def total(values: Iterable[float | None]) -> float | None:
    """Sum, or None when any part is unknown (a partial sum would understate the cost)."""
    out = 0.0
    for v in values:
        if v is None:
            return None
        out += v
    return out
