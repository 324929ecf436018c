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


def _tree_cpu(root: psutil.Process) -> float:
    """CPU seconds of a process, its live children and its reaped children (a postmaster's
    backends come and go; the kernel adds a reaped child's time to its parent's)."""
    total = 0.0
    try:
        t = root.cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
        for child in root.children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except psutil.Error:
                continue
    except psutil.Error:
        return total
    return total


class Infrastructure:
    """The CPU of the Postgres cluster and the Kafka broker under test (the box is shared:
    only the postmaster serving ``database_url`` and the broker on the bootstrap port count)."""

    def __init__(self, database_url: str, bootstrap: str) -> None:
        import psycopg2  # the bench's own dependency; only here

        self.database_url = database_url
        conn = psycopg2.connect(database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                row = cur.fetchone()
            # While the connection is open: its backend exits with it.
            backend = psutil.Process(int(row[0])) if row else None
            self.postmaster = backend.parent() if backend else None
        finally:
            conn.close()
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        self.broker = next((psutil.Process(c.pid) for c in psutil.net_connections("tcp")
                            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                            and c.pid), None)

    def commits(self) -> int | None:
        """Transactions committed by the whole cluster so far (``pg_stat_database``; every
        transaction counts, read-only ones too): where group commit shows."""
        import psycopg2

        try:
            conn = psycopg2.connect(self.database_url)
        except psycopg2.Error:
            return None
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT sum(xact_commit)::bigint FROM pg_stat_database")
                row = cur.fetchone()
            return int(row[0]) if row and row[0] is not None else None
        finally:
            conn.close()

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.postmaster is not None:
            out["postgres"] = _tree_cpu(self.postmaster)
        if self.broker is not None:
            out["kafka"] = _tree_cpu(self.broker)
        return out
