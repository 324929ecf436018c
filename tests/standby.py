"""A PRIVATE PostgreSQL primary with a synchronous physical standby, on free ports, started
by deploy/local/postgres.sh and standby.sh (the scripts an operator runs): for the chaos
cases that stall, kill and promote the standby without disturbing the shared stack.

The primary's ``agentledger`` database is migrated; Kafka is whatever the caller uses.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from agentledger import migrations, settings
from agentledger.testing import processes

SCRIPTS = settings.REPO_ROOT / "deploy" / "local"
NAME = "agentledger_standby"  # NAME in deploy/local/standby.sh: application_name and slot


@dataclass(frozen=True)
class StandbyPair:
    env: dict[str, str]
    primary_url: str  # the owner's URL of the primary's migrated database
    standby_url: str  # the same database on the standby (a primary once promoted)

    def primary(self, *verb: str) -> None:
        """``postgres.sh <verb…>`` on the primary."""
        self._run("postgres.sh", verb)

    def standby(self, *verb: str) -> None:
        """``standby.sh <verb…>`` (start, stop immediate, sync, promote…)."""
        self._run("standby.sh", verb)

    def _run(self, script: str, verb: tuple[str, ...]) -> None:
        done = subprocess.run(["bash", str(SCRIPTS / script), *verb], env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, f"{script} {' '.join(verb)}: {done.stderr[-3000:]}"

    @property
    def standby_dir(self) -> Path:
        return Path(self.env["AGENTLEDGER_LOCAL_DIR"]) / "pg-standby"

    def standby_log(self) -> str:
        return (self.standby_dir / "log" / "server.log").read_text(errors="replace")

    def standby_pids(self) -> list[int]:
        """The standby's postmaster, then every process it started (walreceiver, startup…)."""
        pidfile = self.standby_dir / "data" / "postmaster.pid"
        postmaster = int(pidfile.read_text().split()[0])
        return [postmaster, *_children(postmaster)]

    @contextmanager
    def stalled(self) -> Iterator[list[int]]:
        """The whole standby frozen (SIGSTOP) for the block: it receives, flushes and
        acknowledges nothing, so every commit of the primary parks; SIGCONT on leaving."""
        pids = self.standby_pids()
        stopped: list[int] = []
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            yield pids
        finally:
            for pid in reversed(stopped):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def replication(self) -> tuple[str, str] | None:
        """The primary's view of its standby: (state, sync_state), None when not connected."""
        row = _one(self.primary_url, "SELECT state, sync_state FROM pg_stat_replication "
                   "WHERE application_name = %s", (NAME,))
        return (str(row[0]), str(row[1])) if row else None

    def parked(self) -> list[str]:
        """What waits for the synchronous standby on the primary: one ``login:table,…`` per
        backend whose commit waits (``SyncRep``), naming the tables its transaction wrote."""
        conn = psycopg2.connect(self.primary_url, connect_timeout=5)
        conn.autocommit = True  # read only: never a commit that would itself wait
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT a.usename || ':' || coalesce(string_agg(DISTINCT c.relname, ',' "
                    "ORDER BY c.relname), '') FROM pg_stat_activity a "
                    "LEFT JOIN pg_locks l ON l.pid = a.pid AND l.mode = 'RowExclusiveLock' "
                    "LEFT JOIN pg_class c ON c.oid = l.relation AND c.relkind = 'r' "
                    "WHERE a.wait_event = 'SyncRep' GROUP BY a.pid, a.usename ORDER BY 1")
                return [str(r[0]) for r in cur.fetchall()]
        finally:
            conn.close()


    def parked_s(self, login: str) -> float:
        """How long (server clock) the longest commit of ``login`` has waited for the standby."""
        row = _one(self.primary_url,
                   "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0) "
                   "FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND usename = %s", (login,))
        return float(row[0]) if row else 0.0


def _one(url: str, sql: str, args: tuple[object, ...]) -> tuple[Any, ...] | None:
    conn = psycopg2.connect(url, connect_timeout=5)
    conn.autocommit = True  # read only: never a commit that would itself wait for the standby
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            row: tuple[Any, ...] | None = cur.fetchone()
            return row
    finally:
        conn.close()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # Field 4 is the parent pid; the command name before it may hold spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry.name))
    return found


@contextmanager
def standby_pair_running() -> Iterator[StandbyPair]:
    """Start a private primary and its synchronous standby; stop and remove both after."""
    base = Path(tempfile.mkdtemp(prefix="al-standby-"))
    base.chmod(0o755)  # initdb and postgres run as the `postgres` user when we are root
    pg_port, standby_port = processes.free_port(), processes.free_port()
    env = {**os.environ, "AGENTLEDGER_LOCAL_DIR": str(base),
           "AGENTLEDGER_PG_PORT": str(pg_port), "AGENTLEDGER_PG_STANDBY_PORT": str(standby_port)}
    url = "postgresql://agentledger:agentledger@127.0.0.1:{}/agentledger"
    pair = StandbyPair(env, url.format(pg_port), url.format(standby_port))
    try:
        pair.primary("start")
        pair.standby("start")
        pair.standby("sync")
        # Through the standby already: the migrations' commits wait for it, as every later one.
        asyncio.run(migrations.migrate(pair.primary_url, settings.REPO_ROOT / "migrations"))
        yield pair
    finally:
        for script, verb in (("standby.sh", "immediate"), ("postgres.sh", "immediate")):
            subprocess.run(["bash", str(SCRIPTS / script), "stop", verb], env=env,
                           check=False, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def standby_pair() -> Iterator[StandbyPair]:
    with standby_pair_running() as pair:
        yield pair
