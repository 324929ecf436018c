"""The whole box around one burst: who spent the CPU, and what Postgres was asked to do.

:class:`Meter` reads the kernel's and Postgres's counters when a burst starts and when its
last command completes (the window), samples the Postgres processes in between, and turns
the differences into figures per completed command (:func:`Meter.report`). What the kernel
counts and how a Postgres process is attributed to a database: :mod:`bench.boxcpu`; what
Postgres counts: :mod:`bench.pgcounters`. How to read the result: ``bench/README.md``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from agentledger import db, settings, sql
from bench import boxcpu, pgcounters

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")
# pg_stat_activity and the postmaster's children are read this often during the window: a
# pool's backends live for the whole phase, so a new one is seen within its first 0.2 s, and
# a backend that exits loses at most its last 0.2 s (left as ``unattributed``).
SAMPLE_S = 0.2
METER_APP = f"{boxcpu.BENCH_APP_PREFIX}-meter"
# Thread groups listed per process: enough to see where a process's CPU goes.
TOP_THREADS = 8


@dataclass(frozen=True)
class Side:
    """One system under test: its processes and the databases it uses.

    ``databases`` maps a database name to its role (``ledger``, ``crm``, ``peer_app``...);
    ``own_roles`` are the roles whose Postgres cost is the system's own (our ledger; the
    peer's system and intent databases), as against the CRM stand-in's both sides pay.
    """

    name: str
    services: Mapping[str, int]
    crm_pid: int | None
    databases: Mapping[str, str]
    own_roles: tuple[str, ...]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def pid_stat(pid: int) -> boxcpu.PidStat | None:
    text = _read(f"/proc/{pid}/stat")
    return boxcpu.parse_pid_stat(text) if text else None


def _schedstat_ns(pid: int) -> int | None:
    text = _read(f"/proc/{pid}/schedstat")
    return boxcpu.parse_schedstat(text) if text else None


def _children(pid: int) -> list[int]:
    text = _read(f"/proc/{pid}/task/{pid}/children")
    if text is not None:
        return [int(p) for p in text.split()]
    try:  # a kernel without CONFIG_PROC_CHILDREN
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _ticks_since_boot() -> int:
    uptime = float((_read("/proc/uptime") or "0").split()[0])
    return int(uptime * 1000.0 / TICK_MS)


def sql_catalog() -> dict[str, str]:
    """Every named query of the project's ``.sql`` files (``file stem.name`` → text)."""
    out: dict[str, str] = {}
    for path in [*(settings.REPO_ROOT / "libs").rglob("*.sql"),
                 *(settings.REPO_ROOT / "services").rglob("*.sql")]:
        try:
            queries = sql.load(path)
        except ValueError:  # a schema file, not named queries
            continue
        out.update({f"{path.parent.name}/{name}": text for name, text in queries.items()})
    return out


def _broker_pid(bootstrap: str) -> int | None:
    port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    return next((c.pid for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                 and c.pid), None)


class Meter:
    """Measures one burst of ``side`` (``start`` before it, ``stop`` at its last completion).

    ``meter_url`` is a superuser's URL of a database with ``pg_stat_statements`` and
    ``pg_walinspect`` created (:meth:`bench.databases.Databases.meter_url`).
    """

    def __init__(self, meter_url: str, bootstrap: str, side: Side) -> None:
        self.url, self.side = meter_url, side
        self.conn = psycopg2.connect(meter_url, application_name=METER_APP)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid(), current_setting('shared_preload_libraries')")
            backend, preload = cur.fetchone()
            cur.execute("SELECT oid::bigint, datname FROM pg_database WHERE datname = ANY(%s)",
                        (list(side.databases),))
            self.dbids = {int(oid): side.databases[name] for oid, name in cur.fetchall()}
        stat = pid_stat(int(backend))
        self.postmaster = stat.ppid if stat else None
        self.statements = "pg_stat_statements" in str(preload)
        self.broker = _broker_pid(bootstrap)
        self.pids: dict[str, int] = {**{f"service:{n}": p for n, p in side.services.items()},
                                     "loadgen": os.getpid()}
        if side.crm_pid:
            self.pids["crm"] = side.crm_pid
        if self.broker:
            self.pids["kafka"] = self.broker
        self.published = {role: self._published(name) for name, role in side.databases.items()
                          if role in side.own_roles}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._meter_cpu_s = 0.0
        self._activity: dict[int, str] = {}

    # ---- readings ----

    def _published(self, datname: str) -> list[str]:
        with self._db(datname) as conn, conn.cursor() as cur:
            cur.execute("SELECT DISTINCT tablename::text FROM pg_publication_tables")
            return [str(r[0]) for r in cur.fetchall()]

    def _db(self, datname: str) -> closing[Any]:
        conn = psycopg2.connect(db.with_database(self.url, datname), application_name=METER_APP)
        conn.autocommit = True
        return closing(conn)

    def _process_ticks(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for name, pid in self.pids.items():
            stat = pid_stat(pid)
            out[name] = stat.cpu_ticks if stat else None
        return out

    def _threads(self, trackers: dict[str, boxcpu.PidTracker]) -> None:
        """Each thread's CPU now, by process and thread name (where a process's CPU goes:
        the broker's request handlers or its compiler, a service's Kafka client threads)."""
        for name, pid in self.pids.items():
            tracker = trackers.setdefault(name, boxcpu.PidTracker(self.tracker.window_start_ticks))
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                text = _read(f"/proc/{pid}/task/{tid}/stat")
                if text:
                    stat = boxcpu.parse_pid_stat(text)
                    tracker.observe(tid, stat.start_ticks, stat.cpu_ticks,
                                    boxcpu.thread_group(boxcpu.parse_comm(text)))

    def _cluster_ns(self) -> int | None:
        """Every Postgres process's CPU so far: the postmaster, its live children and the
        children it has reaped."""
        if self.postmaster is None:
            return None
        stat = pid_stat(self.postmaster)
        own = _schedstat_ns(self.postmaster)
        if stat is None or own is None:
            return None
        total = own + int(stat.children_ticks * TICK_MS * 1e6)
        for child in _children(self.postmaster):
            total += _schedstat_ns(child) or 0
        return total

    def _sample(self, conn: Any) -> None:
        """Who each Postgres process works for, and its CPU now."""
        with conn.cursor() as cur:
            cur.execute("SELECT pid, datname, backend_type, coalesce(application_name, '')"
                        " FROM pg_stat_activity")
            for pid, datname, btype, app in cur.fetchall():
                self._activity[int(pid)] = boxcpu.pg_group(
                    boxcpu.Backend(int(pid), datname, str(btype or ""), str(app)),
                    self.side.databases)
        if self.postmaster is None:
            return
        for pid in [self.postmaster, *_children(self.postmaster)]:
            stat, ns = pid_stat(pid), _schedstat_ns(pid)
            if stat is None or ns is None:
                continue
            group = "background" if pid == self.postmaster else self._activity.get(pid)
            self.tracker.observe(pid, stat.start_ticks, ns, group)

    def _sampler(self) -> None:
        conn = psycopg2.connect(self.url, application_name=METER_APP)
        conn.autocommit = True
        began = time.thread_time()
        try:
            while not self._stop.wait(SAMPLE_S):
                self._sample(conn)
        finally:
            self._meter_cpu_s = time.thread_time() - began
            conn.close()

    def _lagged(self) -> dict[str, Any]:
        """The counters Postgres publishes with a delay (see pgcounters.STATS_FLUSH_S)."""
        with self.conn.cursor() as cur:
            dbs = pgcounters.read_databases(cur, list(self.side.databases))
            cur.execute("SELECT sum(xact_commit)::bigint FROM pg_stat_database")
            cluster = int((cur.fetchone() or [0])[0] or 0)
            slots = pgcounters.read_slots(cur, list(self.side.databases))
        tables: dict[str, dict[str, dict[str, int]]] = {}
        for name, role in self.side.databases.items():
            with self._db(name) as conn, conn.cursor() as cur:
                tables[role] = pgcounters.read_tables(cur)
        return {"databases": dbs, "cluster_commits": cluster, "slots": slots, "tables": tables}

    def _at_once(self) -> dict[str, Any]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            lsn = str((cur.fetchone() or [""])[0])
            stmts = (pgcounters.read_statements(cur, list(self.dbids))
                     if self.statements else {})
        return {"lsn": lsn, "statements": stmts, "box": boxcpu.parse_proc_stat(
            _read("/proc/stat") or ""), "processes": self._process_ticks(),
            "cluster_ns": self._cluster_ns(), "at": time.monotonic(), "load": os.getloadavg()}

    # ---- the window ----

    def quiesce(self) -> None:
        """Let the previous work's delayed counters arrive before the window opens."""
        time.sleep(pgcounters.STATS_FLUSH_S)  # Postgres's own publishing delay, not a condition

    def start(self) -> None:
        self.lagged0 = self._lagged()
        self.tracker = boxcpu.PidTracker(_ticks_since_boot())
        self.thread_trackers: dict[str, boxcpu.PidTracker] = {}
        self._sample(self.conn)
        self.t0 = self._at_once()
        self._threads(self.thread_trackers)
        self._thread = threading.Thread(target=self._sampler, name="bench-meter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.t1 = self._at_once()
        self._threads(self.thread_trackers)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(self.conn)

    def report(self, commands: int) -> dict[str, Any]:
        """Every figure of the window per command; waits for the delayed counters first,
        then as long again to measure what the system does at rest (taken off them)."""
        time.sleep(pgcounters.STATS_FLUSH_S)  # Postgres's own publishing delay, not a condition
        lagged1, at1 = self._lagged(), time.monotonic()
        time.sleep(pgcounters.STATS_FLUSH_S)  # the rest, measured over as long a span
        rest, at2 = self._lagged(), time.monotonic()
        t0, t1 = self.t0, self.t1
        out: dict[str, Any] = {"window_s": round(t1["at"] - t0["at"], 2),
                               "load_avg_before": [round(x, 2) for x in t0["load"]],
                               "load_avg_after": [round(x, 2) for x in t1["load"]]}
        out.update(self._postgres(commands, lagged1, rest, at1 - t1["at"], at2 - at1))
        out.update(self._cpu(commands))
        for name in ("kafka", "crm"):
            if name not in self.pids:
                out["unmeasured"][name] = "its process was not found"
        if self.postmaster is None:
            out["unmeasured"]["postgres"] = "the postmaster was not found"
        self.conn.close()
        return out

    def _cpu(self, commands: int) -> dict[str, Any]:
        t0, t1, side = self.t0, self.t1, self.side
        box_ticks = {k: t1["box"][k] - t0["box"].get(k, 0) for k in t1["box"]}
        box_ms = boxcpu.busy_ticks(box_ticks) * TICK_MS
        proc_ms: dict[str, float | None] = {}
        for name in self.pids:
            a, b = t0["processes"].get(name), t1["processes"].get(name)
            proc_ms[name] = None if a is None or b is None else (b - a) * TICK_MS
        meter_ms = self._meter_cpu_s * 1000.0
        if proc_ms.get("loadgen") is not None:
            proc_ms["loadgen"] = max(0.0, (proc_ms["loadgen"] or 0.0) - meter_ms)
        pg_groups = {g: ns / 1e6 for g, ns in self.tracker.by_group().items()}
        cluster_ms = (None if t0["cluster_ns"] is None or t1["cluster_ns"] is None
                      else (t1["cluster_ns"] - t0["cluster_ns"]) / 1e6)
        if cluster_ms is not None:
            pg_groups["unattributed"] = (pg_groups.get("unattributed", 0.0) + cluster_ms
                                         - sum(pg_groups.values()))
        services = {n.removeprefix("service:"): v for n, v in proc_ms.items()
                    if n.startswith("service:")}
        own_pg = boxcpu.total(v for g, v in pg_groups.items()
                              if g.split(":")[0] in side.own_roles) if pg_groups else None
        parts = {"services": boxcpu.total(services.values()), "postgres": cluster_ms,
                 "kafka": proc_ms.get("kafka"), "crm": proc_ms.get("crm"),
                 "loadgen": proc_ms.get("loadgen"), "meter": meter_ms}
        accounted = boxcpu.total(parts.values())
        per = {k: boxcpu.ms_per_cmd(v, commands) for k, v in parts.items()}
        per.update({
            "box": boxcpu.ms_per_cmd(box_ms, commands),
            "accounted": boxcpu.ms_per_cmd(accounted, commands),
            "other_processes": boxcpu.ms_per_cmd(
                None if accounted is None else box_ms - accounted, commands),
            "own_postgres": boxcpu.ms_per_cmd(own_pg, commands),
        })
        window_s = max(t1["at"] - t0["at"], 1e-9)
        return {
            "cpu_ms_per_cmd": per,
            "services_by_process_ms_per_cmd": {
                n: boxcpu.ms_per_cmd(v, commands) for n, v in services.items()},
            "postgres_by_group_ms_per_cmd": {
                g: boxcpu.ms_per_cmd(v, commands) for g, v in sorted(pg_groups.items())},
            "threads_ms_per_cmd": {
                name: {g: boxcpu.ms_per_cmd(v * TICK_MS, commands) for g, v in sorted(
                    t.by_group().items(), key=lambda kv: -kv[1])[:TOP_THREADS] if v > 0}
                for name, t in self.thread_trackers.items()},
            "box_cores_busy": round(box_ms / 1000.0 / window_s, 2),
            "box_ticks": box_ticks,
        }

    def _postgres(self, commands: int, lagged1: dict[str, Any], rest: dict[str, Any],
                  tail_s: float, rest_s: float) -> dict[str, Any]:
        t0, t1, l0 = self.t0, self.t1, self.lagged0
        out: dict[str, Any] = {"unmeasured": {}}
        wal = pgcounters.lsn_bytes(t1["lsn"]) - pgcounters.lsn_bytes(t0["lsn"])
        out["wal_bytes_per_cmd"] = round(wal / max(commands, 1), 1)
        try:
            with self.conn.cursor() as cur:
                records = pgcounters.read_wal(cur, t0["lsn"], t1["lsn"])
            out["wal_by_database"] = pgcounters.wal_summary(records, self.dbids, commands)
        except psycopg2.Error as exc:  # e.g. the segments were recycled by a checkpoint
            out["unmeasured"]["wal_by_database"] = f"pg_walinspect: {exc}".strip()[:300]
        if self.statements:
            deltas = pgcounters.diff_statements(t0["statements"], t1["statements"])
            with self.conn.cursor() as cur:
                texts = pgcounters.read_texts(cur, sorted({k[2] for k in deltas}))
            out["statements"] = pgcounters.statements_summary(deltas, texts, self.dbids,
                                                              commands, sql_catalog())
        else:
            out["unmeasured"]["statements"] = (
                "pg_stat_statements is not in shared_preload_libraries: a cluster initialised "
                "before it was added to deploy/local/postgres/postgresql.conf needs the line "
                "and a restart (bench/README.md)")
        out["delayed_counters"] = {"counted_past_window_s": round(tail_s, 1),
                                   "rest_measured_s": round(rest_s, 1)}
        window = pgcounters.less_rest(lagged1["databases"], rest["databases"], tail_s, rest_s)
        dbs = pgcounters.diff_rows(l0["databases"], window, commands)
        out["databases_per_cmd"] = {self.side.databases.get(n, n): v for n, v in dbs.items()}
        # The bench's completion polls are autocommit reads: one commit each, not the system's.
        for role, summary in out.get("statements", {}).items():
            counts = out["databases_per_cmd"].get(role, {})
            if summary["bench_statements"] and "xact_commit" in counts:
                counts["xact_commit"] = round(
                    counts["xact_commit"] - summary["bench_statements"] / max(commands, 1), 3)
        if not self.statements:
            out["unmeasured"]["commits_less_polling"] = (
                "without pg_stat_statements the bench's completion polls (one commit each, "
                "4 a second) stay in the commit counts")
        out["databases_at_rest_per_s"] = {
            self.side.databases.get(n, n): v for n, v in pgcounters.diff_rows(
                lagged1["databases"], rest["databases"], 1).items()}
        for v in out["databases_at_rest_per_s"].values():
            v.update({k: round(x / max(rest_s, 1e-9), 2) for k, x in v.items()})
        cluster = pgcounters.less_rest({"c": {"n": lagged1["cluster_commits"]}},
                                       {"c": {"n": rest["cluster_commits"]}}, tail_s, rest_s)
        polls = sum(v["bench_statements"] for v in out.get("statements", {}).values())
        out["cluster_commits_per_cmd"] = round(
            (cluster["c"]["n"] - l0["cluster_commits"] - polls) / max(commands, 1), 3)
        out["tables_per_cmd"] = {
            role: pgcounters.diff_rows(l0["tables"].get(role, {}), pgcounters.less_rest(
                t, rest["tables"].get(role, {}), tail_s, rest_s), commands)
            for role, t in lagged1["tables"].items()}
        out["slots_per_cmd"] = pgcounters.diff_rows(l0["slots"], lagged1["slots"], commands)
        published = sum(out["tables_per_cmd"].get(role, {}).get(table, {}).get("ins", 0.0)
                        for role, tables in self.published.items() for table in tables)
        decoded = sum(out.get("wal_by_database", {}).get(role, {}).get(
            "decoded_changes_per_cmd", 0.0) for role in self.published)
        out["published_rows_per_cmd"] = round(published, 3)
        if published and "wal_by_database" in out:
            out["decoded_changes_per_published_row"] = round(decoded / published, 2)
        return out
