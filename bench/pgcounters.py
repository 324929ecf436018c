"""What a burst asked of Postgres: statements, commits, row versions, WAL and decoding.

Read around a burst by :mod:`bench.meter` through a superuser connection:

- statements: ``pg_stat_statements`` (loaded by ``deploy/local/postgres/postgresql.conf``;
  ``track = all``, so statements run inside functions and triggers show, ``toplevel`` apart),
  differenced per (database, user, query id, toplevel); the bench's own statements start with
  :data:`BENCH_SQL_MARK` and are left out;
- commits and row versions: ``pg_stat_database`` and ``pg_stat_user_tables`` of each database;
- WAL: ``pg_current_wal_lsn()`` at both ends, and ``pg_walinspect`` over that range for the
  records per database and kind (a heap change of a database is what its walsender decodes);
- decoding: ``pg_stat_replication_slots`` of the slot in each database.

The pure parts (differences, classification, the summary per command) are unit-tested.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Postgres 15 backends send their counters to shared memory at most once a second while
# busy and up to 10 s (PGSTAT_IDLE_INTERVAL) after they go idle: pg_stat_database and
# pg_stat_user_tables are read this long after the burst, so its last commits are in.
# pg_stat_statements, the WAL position and /proc are read at once (no such delay).
STATS_FLUSH_S = 11.0
# The bench's own SQL (completion polling) starts with this comment: its statements are not
# the system's. pg_stat_statements keeps the comment in the normalised text.
BENCH_SQL_MARK = "/* bench */"
# Statements that only delimit a transaction: a lever may fold them into another round trip,
# so they are counted apart from the statements that do the work.
_TX_CONTROL = frozenset({"BEGIN", "COMMIT", "ROLLBACK", "START", "END", "ABORT",
                         "SAVEPOINT", "RELEASE"})
_LEADING_COMMENTS = re.compile(r"^(\s|--[^\n]*\n|/\*.*?\*/)*", re.S)
# Heap records a walsender queues as changes for decoding (every table of its database: the
# output plugin filters by publication afterwards); HEAP_CONFIRM is the second change of an
# INSERT ... ON CONFLICT (speculative insertion). MULTI_INSERT counts once per record.
DECODED_RECORDS = frozenset({
    ("Heap", "INSERT"), ("Heap", "INSERT+INIT"), ("Heap", "UPDATE"), ("Heap", "UPDATE+INIT"),
    ("Heap", "HOT_UPDATE"), ("Heap", "HOT_UPDATE+INIT"), ("Heap", "DELETE"),
    ("Heap", "HEAP_CONFIRM"), ("Heap2", "MULTI_INSERT"), ("Heap2", "MULTI_INSERT+INIT")})
# How many statements the summary lists per database, by calls and by execution time.
TOP_STATEMENTS = 25
# Characters a statement and a named query must share from their start to be taken as the
# same: past the purpose comment (every named query has one) or into the statement itself.
_NAME_MATCH = 48

StatementKey = tuple[int, int, int, bool]  # dbid, userid, queryid, toplevel


@dataclass(frozen=True)
class StatementCount:
    calls: int
    exec_ms: float
    rows: int


def lsn_bytes(lsn: str) -> int:
    """A ``pg_lsn`` (``'16/B374D848'``) as a byte position."""
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def is_transaction_control(query: str) -> bool:
    """Whether a statement only begins or ends a transaction (or a savepoint)."""
    text = _LEADING_COMMENTS.sub("", query, count=1)
    words = text.split(None, 1)
    return bool(words) and words[0].rstrip(";").upper() in _TX_CONTROL


def strip_comments(query: str) -> str:
    """A statement's text without its leading comments, on one line."""
    return " ".join(_LEADING_COMMENTS.sub("", query, count=1).split())


def name_of(query: str, catalog: Mapping[str, str]) -> str | None:
    """The ``-- name: ... --`` of a statement in the project's ``.sql`` files (``catalog``:
    name → text as loaded), by the longest common start of their texts on one line; None
    when fewer than :data:`_NAME_MATCH` characters agree and the texts are not equal (the
    statement is written in Python, or is Postgres's own, such as a foreign key check)."""
    text = " ".join(query.split())
    best, best_len = None, 0
    for name, sql in catalog.items():
        other = " ".join(sql.split())
        n = 0
        for a, b in zip(text, other, strict=False):
            if a != b:
                break
            n += 1
        whole = n == len(other) == len(text)  # a short named query: only itself
        if (n >= _NAME_MATCH or whole) and n > best_len:
            best, best_len = name, n
    return best


def diff_statements(before: Mapping[StatementKey, StatementCount],
                    after: Mapping[StatementKey, StatementCount]
                    ) -> dict[StatementKey, StatementCount]:
    """What each statement did between two snapshots (entries new in ``after`` from zero)."""
    out: dict[StatementKey, StatementCount] = {}
    zero = StatementCount(0, 0.0, 0)
    for key, now in after.items():
        was = before.get(key, zero)
        if now.calls < was.calls:  # reset or evicted and re-created in between: from zero
            was = zero
        if now.calls > was.calls:
            out[key] = StatementCount(now.calls - was.calls, now.exec_ms - was.exec_ms,
                                      now.rows - was.rows)
    return out


def statements_summary(deltas: Mapping[StatementKey, StatementCount],
                       texts: Mapping[int, str], roles: Mapping[int, str],
                       commands: int, catalog: Mapping[str, str] | None = None
                       ) -> dict[str, Any]:
    """Per database role: statements per command and the top statements.

    ``bench_statements`` counts the bench's own (marked) statements, left out of the rest:
    each is an autocommit poll, so also one commit in ``pg_stat_database``.

    ``statements_per_cmd`` counts top-level statements that do work (not BEGIN, COMMIT and
    the like); ``all_toplevel_per_cmd`` adds those; ``nested_per_cmd`` counts statements run
    inside functions and triggers (not round trips). ``exec_ms`` is time in the executor
    (wall clock, waits included), not CPU.
    """
    per: dict[str, dict[str, Any]] = {}
    # One row per statement text: Postgres may give the same text several query ids (seen
    # for the same user and database), which would split one statement into several rows.
    rows: dict[str, dict[tuple[str, bool], dict[str, Any]]] = {}
    for (dbid, _user, queryid, toplevel), d in deltas.items():
        role = roles.get(dbid)
        query = texts.get(queryid, "")
        if role is None:
            continue
        s = per.setdefault(role, {"work": 0, "control": 0, "nested": 0, "bench": 0})
        if query.lstrip().startswith(BENCH_SQL_MARK):
            s["bench"] += d.calls
            continue
        if not toplevel:
            s["nested"] += d.calls
        elif is_transaction_control(query):
            s["control"] += d.calls
        else:
            s["work"] += d.calls
        text = " ".join(query.split())
        row = rows.setdefault(role, {}).setdefault((text, toplevel), {
            "name": name_of(query, catalog or {}),
            "query": strip_comments(query)[:240], "toplevel": toplevel,
            "calls": 0, "exec_ms": 0.0, "rows": 0})
        row["calls"] += d.calls
        row["exec_ms"] += d.exec_ms
        row["rows"] += d.rows
    out: dict[str, Any] = {}
    n = max(commands, 1)
    for role, s in per.items():
        ranked = list(rows[role].values())
        for r in ranked:
            r["calls_per_cmd"] = round(r.pop("calls") / n, 3)
            r["exec_ms_per_cmd"] = round(r.pop("exec_ms") / n, 4)
            r["rows_per_cmd"] = round(r.pop("rows") / n, 3)
        out[role] = {
            "statements_per_cmd": round(s["work"] / n, 3),
            "all_toplevel_per_cmd": round((s["work"] + s["control"]) / n, 3),
            "nested_per_cmd": round(s["nested"] / n, 3),
            "bench_statements": s["bench"],
            "top_by_calls": sorted(ranked, key=lambda r: -r["calls_per_cmd"])[:TOP_STATEMENTS],
            "top_by_exec_ms": sorted(ranked,
                                     key=lambda r: -r["exec_ms_per_cmd"])[:TOP_STATEMENTS],
        }
    return out


def diff_rows(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]],
              commands: int) -> dict[str, dict[str, float]]:
    """Per name (a database, a table), each counter's increase per command (zeros left out)."""
    out: dict[str, dict[str, float]] = {}
    n = max(commands, 1)
    for name, now in after.items():
        was = before.get(name, {})
        moved = {k: round((v - was.get(k, 0)) / n, 3) for k, v in now.items()
                 if round(v - was.get(k, 0), 6) != 0}
        if moved:
            out[name] = moved
    return out


def less_rest(after: Mapping[str, Mapping[str, int]], rest: Mapping[str, Mapping[str, int]],
              tail_s: float, rest_s: float) -> dict[str, dict[str, float]]:
    """``after`` less what the system did at rest during the ``tail_s`` seconds it counts
    past the window (delayed counters are read that long after it): ``rest`` is the same
    counters ``rest_s`` seconds after ``after``, when nothing but the system's idle work
    (pollers, periodic sweeps) ran."""
    out: dict[str, dict[str, float]] = {}
    scale = tail_s / rest_s if rest_s > 0 else 0.0
    for name, now in after.items():
        later = rest.get(name, now)
        out[name] = {k: v - (later.get(k, v) - v) * scale for k, v in now.items()}
    return out


def wal_summary(records: list[tuple[str, str, str, int, int, int]],
                roles: Mapping[int, str], commands: int) -> dict[str, Any]:
    """WAL records of a burst per database role and kind, per command.

    ``records`` are (database oid as text or '', resource manager, record type, count,
    bytes, full-page-image bytes); a record without a block (a commit, a running-xacts
    snapshot) has no database and counts under ``no_relation``.
    """
    n = max(commands, 1)
    out: dict[str, Any] = {}
    for db, rmgr, rtype, count, size, fpi in records:
        if not db:
            role = "no_relation"
        else:
            role = roles.get(int(db), "shared_catalog" if db == "0" else "other_databases")
        r = out.setdefault(role, {"records_per_cmd": 0.0, "bytes_per_cmd": 0.0,
                                  "fpi_bytes_per_cmd": 0.0, "decoded_changes_per_cmd": 0.0,
                                  "by_kind": {}})
        r["records_per_cmd"] += count / n
        r["bytes_per_cmd"] += size / n
        r["fpi_bytes_per_cmd"] += fpi / n
        if (rmgr, rtype) in DECODED_RECORDS:
            r["decoded_changes_per_cmd"] += count / n
        kind = f"{rmgr}/{rtype}"
        r["by_kind"][kind] = r["by_kind"].get(kind, 0.0) + count / n
    for r in out.values():
        for k in ("records_per_cmd", "bytes_per_cmd", "fpi_bytes_per_cmd",
                  "decoded_changes_per_cmd"):
            r[k] = round(r[k], 2)
        r["by_kind"] = {k: round(v, 2) for k, v in
                        sorted(r["by_kind"].items(), key=lambda kv: -kv[1]) if v >= 0.005}
    return out


# ---- reads (a psycopg2 cursor of a superuser) ----

STATEMENTS_SQL = (
    "SELECT dbid::bigint, userid::bigint, queryid, toplevel, calls, total_exec_time, rows"
    " FROM pg_stat_statements(false) WHERE dbid = ANY(%s::oid[]) AND queryid IS NOT NULL")
TEXTS_SQL = "SELECT DISTINCT queryid, query FROM pg_stat_statements(true) WHERE queryid = ANY(%s)"
DATABASE_SQL = (
    "SELECT datname, xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted,"
    " blks_read, blks_hit FROM pg_stat_database WHERE datname = ANY(%s)")
TABLES_SQL = (
    "SELECT relname, sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint,"
    " sum(n_tup_hot_upd)::bigint, sum(n_tup_del)::bigint FROM pg_stat_user_tables"
    " GROUP BY relname")
SLOTS_SQL = (
    "SELECT r.database, s.slot_name, s.total_txns, s.total_bytes, s.spill_bytes,"
    " s.stream_bytes FROM pg_stat_replication_slots s"
    " JOIN pg_replication_slots r USING (slot_name) WHERE r.database = ANY(%s)")
WAL_SQL = (
    "SELECT coalesce(substring(block_ref from 'rel [0-9]+/([0-9]+)/'), ''), resource_manager,"
    " record_type, count(*), sum(record_length)::bigint, sum(fpi_length)::bigint"
    " FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) GROUP BY 1, 2, 3")


def read_statements(cur: Any, dbids: list[int]) -> dict[StatementKey, StatementCount]:
    cur.execute(STATEMENTS_SQL, (dbids,))
    return {(int(d), int(u), int(q), bool(t)): StatementCount(int(c), float(ms), int(r))
            for d, u, q, t, c, ms, r in cur.fetchall()}


def read_texts(cur: Any, queryids: list[int]) -> dict[int, str]:
    cur.execute(TEXTS_SQL, (queryids,))
    return {int(q): str(text) for q, text in cur.fetchall()}


def read_databases(cur: Any, names: list[str]) -> dict[str, dict[str, int]]:
    cur.execute(DATABASE_SQL, (names,))
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted",
            "blks_read", "blks_hit")
    return {str(row[0]): dict(zip(keys, (int(v or 0) for v in row[1:]), strict=True))
            for row in cur.fetchall()}


def read_tables(cur: Any) -> dict[str, dict[str, int]]:
    cur.execute(TABLES_SQL)
    keys = ("ins", "upd", "hot_upd", "del")
    return {str(row[0]): dict(zip(keys, (int(v or 0) for v in row[1:]), strict=True))
            for row in cur.fetchall()}


def read_slots(cur: Any, names: list[str]) -> dict[str, dict[str, int]]:
    cur.execute(SLOTS_SQL, (names,))
    keys = ("total_txns", "total_bytes", "spill_bytes", "stream_bytes")
    return {f"{row[0]}:{row[1]}": dict(zip(keys, (int(v or 0) for v in row[2:]), strict=True))
            for row in cur.fetchall()}


def read_wal(cur: Any, start: str, end: str) -> list[tuple[str, str, str, int, int, int]]:
    cur.execute(WAL_SQL, (start, end))
    return [(str(db), str(rm), str(rt), int(c), int(b or 0), int(f or 0))
            for db, rm, rt, c, b, f in cur.fetchall()]
