"""The whole-box figures of a run (``bench.meter``'s burst results), ours beside the peer's.

Named in ``latest.json``'s figures so runs compare: ``box_cpu_ms_per_cmd`` (the issue's
headline unit), the peer's, their ratio, and the parts. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from bench import stats

# (figure for ours, figure for the peer, key in the meter's cpu_ms_per_cmd, label)
CPU_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("box_cpu_ms_per_cmd", "peer_box_cpu_ms_per_cmd", "box",
     "**whole box** (/proc/stat: user+nice+system+irq+softirq, every process)"),
    ("box_accounted_cpu_ms_per_cmd", "peer_box_accounted_cpu_ms_per_cmd", "accounted",
     "the processes under test (sum of the rows below)"),
    ("box_other_cpu_ms_per_cmd", "peer_box_other_cpu_ms_per_cmd", "other_processes",
     "everything else on the box (other users' processes, kernel threads)"),
    ("services_cpu_ms_per_cmd", "peer_services_cpu_ms_per_cmd", "services",
     "the system's own processes (ours: 6 services; the peer: 2 DBOS processes)"),
    ("pg_cpu_ms_per_cmd", "peer_pg_cpu_ms_per_cmd", "postgres",
     "Postgres, the whole cluster"),
    ("ledger_pg_cpu_ms_per_cmd", "peer_own_pg_cpu_ms_per_cmd", "own_postgres",
     "… of it the system's own databases (ours: ledger; peer: system + intent DB),"
     " backends + walsender + autovacuum"),
    ("kafka_cpu_ms_per_cmd", "peer_kafka_cpu_ms_per_cmd", "kafka", "Kafka broker"),
    ("crm_cpu_ms_per_cmd", "peer_crm_cpu_ms_per_cmd", "crm", "CRM stand-in process"),
    ("loadgen_cpu_ms_per_cmd", "peer_loadgen_cpu_ms_per_cmd", "loadgen",
     "load generator (the bench process, the meter thread apart)"),
    ("meter_cpu_ms_per_cmd", "peer_meter_cpu_ms_per_cmd", "meter", "the meter's sampling thread"),
)


# The JVM's compiler threads ("C2 CompilerThread0", cut to 15 characters, digits folded).
JIT_THREADS = "CN CompilerThre"


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _own_sum(box: dict[str, Any], roles: tuple[str, ...], *path: str) -> float | None:
    values = [_get(box, *path[:1], role, *path[1:]) for role in roles]
    known = [float(v) for v in values if isinstance(v, int | float)]
    return round(sum(known), 3) if known else None


def figures(details: dict[str, Any]) -> dict[str, Any]:
    """The named whole-box figures (None where a phase or a counter is missing)."""
    ours = _get(details.get("e2e"), "burst", "box") or {}
    peer = _get(details.get("peer"), "burst", "box") or {}
    f: dict[str, Any] = {}
    for mine, theirs, key, _ in CPU_ROWS:
        f[mine] = _get(ours, "cpu_ms_per_cmd", key)
        f[theirs] = _get(peer, "cpu_ms_per_cmd", key)
    f["crm_pg_cpu_ms_per_cmd"] = _get(ours, "postgres_by_group_ms_per_cmd", "crm")
    f["peer_crm_pg_cpu_ms_per_cmd"] = _get(peer, "postgres_by_group_ms_per_cmd", "crm")
    f["ledger_walsender_cpu_ms_per_cmd"] = _get(ours, "postgres_by_group_ms_per_cmd",
                                                "ledger:walsender")
    # The broker's JIT compiler threads: a broker started shortly before the bench is still
    # compiling (counted in kafka_cpu_ms_per_cmd all the same; shown so a reader can tell).
    f["kafka_jit_cpu_ms_per_cmd"] = _get(ours, "threads_ms_per_cmd", "kafka", JIT_THREADS)
    f["peer_kafka_jit_cpu_ms_per_cmd"] = _get(peer, "threads_ms_per_cmd", "kafka", JIT_THREADS)
    f["ledger_statements_per_cmd"] = _get(ours, "statements", "ledger", "statements_per_cmd")
    f["ledger_statements_all_per_cmd"] = _get(ours, "statements", "ledger",
                                              "all_toplevel_per_cmd")
    peer_roles = ("peer_system", "peer_app")
    f["peer_statements_per_cmd"] = _own_sum(peer, peer_roles, "statements",
                                            "statements_per_cmd")
    f["ledger_commits_per_cmd"] = _get(ours, "databases_per_cmd", "ledger", "xact_commit")
    f["peer_own_commits_per_cmd"] = _own_sum(peer, peer_roles, "databases_per_cmd",
                                             "xact_commit")
    f["wal_bytes_per_cmd"] = _get(ours, "wal_bytes_per_cmd")
    f["peer_wal_bytes_per_cmd"] = _get(peer, "wal_bytes_per_cmd")
    f["decoded_changes_per_published_row"] = _get(ours, "decoded_changes_per_published_row")
    f["box_cpu_ratio_peer_to_ours"] = stats.ratio(f["peer_box_cpu_ms_per_cmd"],
                                                  f["box_cpu_ms_per_cmd"])
    f["box_accounted_cpu_ratio_peer_to_ours"] = stats.ratio(
        f["peer_box_accounted_cpu_ms_per_cmd"], f["box_accounted_cpu_ms_per_cmd"])
    f["box_load_avg"] = {side: [_get(b, "load_avg_before"), _get(b, "load_avg_after")]
                         for side, b in (("ours", ours), ("peer", peer)) if b}
    return f


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def markdown(f: dict[str, Any], details: dict[str, Any]) -> list[str]:
    """The whole box per command, ours beside the peer's; then the ledger's top statements."""
    if f.get("box_cpu_ms_per_cmd") is None and f.get("peer_box_cpu_ms_per_cmd") is None:
        return []
    lines = ["", "## The whole box per command (burst)", "",
             "Load average (1, 5, 15 min) before → after each burst: "
             + "; ".join(f"{side} {b[0]} → {b[1]}" for side, b in f["box_load_avg"].items()),
             "", "| CPU-ms per command | ours | peer | peer ÷ ours |",
             "| --- | ---: | ---: | ---: |"]
    for mine, theirs, _, label in CPU_ROWS:
        lines.append(f"| {label} | {_cell(f.get(mine))} | {_cell(f.get(theirs))} | "
                     f"{_cell(stats.ratio(f.get(theirs), f.get(mine)))} |")
    lines.append(f"| … the CRM's database | {_cell(f.get('crm_pg_cpu_ms_per_cmd'))} | "
                 f"{_cell(f.get('peer_crm_pg_cpu_ms_per_cmd'))} | |")
    lines.append(f"| … of the broker's, its JIT compiler (a broker still warming up) | "
                 f"{_cell(f.get('kafka_jit_cpu_ms_per_cmd'))} | "
                 f"{_cell(f.get('peer_kafka_jit_cpu_ms_per_cmd'))} | |")
    others = [("statements per command, own databases (top level, BEGIN/COMMIT apart)",
               "ledger_statements_per_cmd", "peer_statements_per_cmd"),
              ("commits per command, own databases", "ledger_commits_per_cmd",
               "peer_own_commits_per_cmd"),
              ("WAL bytes per command (whole cluster)", "wal_bytes_per_cmd",
               "peer_wal_bytes_per_cmd")]
    for label, mine, theirs in others:
        lines.append(f"| {label} | {_cell(f.get(mine))} | {_cell(f.get(theirs))} | "
                     f"{_cell(stats.ratio(f.get(theirs), f.get(mine)))} |")
    lines.append(f"| decoded changes per published row (ledger) | "
                 f"{_cell(f.get('decoded_changes_per_published_row'))} | | |")
    ours = _get(details.get("e2e"), "burst", "box") or {}
    groups = ours.get("postgres_by_group_ms_per_cmd") or {}
    if groups:
        lines += ["", "Our Postgres CPU-ms per command by process group: " + ", ".join(
            f"{g} {_cell(v)}" for g, v in groups.items()) + "."]
    top = _get(ours, "statements", "ledger", "top_by_calls") or []
    if top:
        lines += ["", "Ledger statements per command, the burst (pg_stat_statements; nested ="
                  " inside a function or trigger; exec ms is wall time in the executor):", "",
                  "| calls | exec ms | level | name | statement |",
                  "| ---: | ---: | --- | --- | --- |"]
        lines += [f"| {r['calls_per_cmd']} | {r['exec_ms_per_cmd']} | "
                  f"{'top' if r['toplevel'] else 'nested'} | {r.get('name') or ''} | "
                  f"`{r['query'][:90].replace('|', '¦')}` |" for r in top[:20]]
    return lines
