"""The whole-box meter's pure parts: /proc parsing, who a Postgres process works for, the
Postgres counters' differences, the ratios and the bars (no I/O; no figure is asserted)."""

from __future__ import annotations

from bench import bars, boxcpu, boxreport, pgcounters, report

PROC_STAT = """cpu  647922 1043 62848 200233 1822 0 5269 1134 0 0
cpu0 325219 417 31278 99439 1043 0 2196 530 0 0
intr 1 2 3
"""


def test_proc_stat_busy_is_user_nice_system_irq_softirq() -> None:
    fields = boxcpu.parse_proc_stat(PROC_STAT)
    assert fields["idle"] == 200233 and fields["steal"] == 1134
    assert boxcpu.busy_ticks(fields) == 647922 + 1043 + 62848 + 0 + 5269


def test_pid_stat_survives_a_command_name_with_spaces_and_parentheses() -> None:
    # pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ... starttime(22)
    rest = "S 42 1 1 0 -1 0 0 0 0 0 70 30 5 6 20 0 1 0 12345 0 0"
    stat = boxcpu.parse_pid_stat(f"777 (postgres: a) (b) {rest}")
    assert stat == boxcpu.PidStat(ppid=42, cpu_ticks=100, children_ticks=11, start_ticks=12345)
    assert boxcpu.parse_schedstat("200005 1009351 2\n") == 200005
    assert boxcpu.parse_comm(f"777 (postgres: a) (b) {rest}") == "postgres: a) (b"
    assert boxcpu.thread_group("GC Thread#12") == "GC Thread#N"
    assert boxcpu.thread_group("rdk:broker3") == "rdk:brokerN"


def test_a_postgres_process_counts_for_the_database_it_serves() -> None:
    roles = {"al_ledger": "ledger", "al_crm": "crm"}

    def group(datname: str | None, btype: str = "client backend", app: str = "") -> str:
        return boxcpu.pg_group(boxcpu.Backend(1, datname, btype, app), roles)

    assert group("al_ledger") == "ledger"
    assert group("al_ledger", "parallel worker") == "ledger"
    assert group("al_ledger", "walsender") == "ledger:walsender"
    assert group("al_ledger", "autovacuum worker") == "ledger:autovacuum"
    assert group("al_crm") == "crm"
    assert group(None, "checkpointer") == "background"
    assert group("someone_elses") == "other_databases"
    assert group("al_ledger", app="agentledger-bench-meter") == "bench"


def test_tracker_counts_only_the_window_and_new_processes_from_zero() -> None:
    t = boxcpu.PidTracker(window_start_ticks=1000)
    t.observe(10, start_ticks=500, cpu=7_000, group="ledger")  # alive before the window
    t.observe(11, start_ticks=1200, cpu=300, group="crm")  # started inside it
    t.observe(10, start_ticks=500, cpu=9_500, group="ledger")
    t.observe(11, start_ticks=1200, cpu=800, group=None)  # left pg_stat_activity: keeps crm
    t.observe(10, start_ticks=1500, cpu=50, group="bench")  # pid 10 reused by a new process
    t.observe(12, start_ticks=900, cpu=40, group=None)  # never named
    t.observe(12, start_ticks=900, cpu=90, group=None)
    assert t.by_group() == {"ledger": 2_500, "crm": 800, "bench": 50, "unattributed": 50}


def test_sums_and_per_command_refuse_a_missing_part() -> None:
    assert boxcpu.total([1.0, 2.5]) == 3.5
    assert boxcpu.total([1.0, None]) is None
    assert boxcpu.ms_per_cmd(1000.0, 300) == 3.333
    assert boxcpu.ms_per_cmd(None, 300) is None and boxcpu.ms_per_cmd(1.0, 0) is None


def test_lsn_and_transaction_control() -> None:
    assert pgcounters.lsn_bytes("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert pgcounters.lsn_bytes("0/10") - pgcounters.lsn_bytes("0/0") == 16
    for q in ("BEGIN ISOLATION LEVEL READ COMMITTED", "commit", "-- why\nROLLBACK",
              "/* x */ SAVEPOINT a", "END;"):
        assert pgcounters.is_transaction_control(q), q
    for q in ("SELECT set_config($1, $2, $3)", "-- COMMIT the row\nINSERT INTO t VALUES ($1)",
              "WITH begin AS (SELECT 1) SELECT * FROM begin"):
        assert not pgcounters.is_transaction_control(q), q


def test_statement_differences_and_the_summary_per_command() -> None:
    count = pgcounters.StatementCount
    before = {(1, 9, 100, True): count(10, 5.0, 10), (1, 9, 101, True): count(50, 1.0, 0),
              (1, 9, 104, True): count(500, 9.0, 0)}
    after = {(1, 9, 100, True): count(40, 20.0, 40),  # 30 calls in the window
             (1, 9, 101, True): count(60, 2.0, 0),  # 10 BEGINs
             (1, 9, 102, False): count(20, 4.0, 20),  # new, nested in a function
             (1, 9, 103, True): count(30, 3.0, 30),  # the bench's own polling
             (1, 9, 104, True): count(5, 0.5, 0),  # reset in between: counted from zero
             (1, 9, 105, True): count(6, 1.0, 6),  # the same text under another query id
             (2, 9, 100, True): count(7, 1.0, 7)}  # another role's database
    deltas = pgcounters.diff_statements(before, after)
    assert deltas[(1, 9, 100, True)] == count(30, 15.0, 30)
    assert deltas[(1, 9, 104, True)] == count(5, 0.5, 0)
    texts = {100: "-- Seed §4: insert\nINSERT INTO agent_command VALUES ($1)", 101: "BEGIN",
             102: "INSERT INTO audit_event VALUES ($1)", 103: "/* bench */ SELECT 1",
             104: "SELECT agentledger_xid_visible($1)",
             105: "-- Seed §4: insert\nINSERT INTO  agent_command VALUES ($1)"}
    catalog = {"ledger/admit_command": "-- Seed §4: insert\nINSERT INTO agent_command VALUES ($1)"}
    summary = pgcounters.statements_summary(deltas, texts, {1: "ledger", 2: "crm"}, 10,
                                            catalog)
    ledger = summary["ledger"]
    assert ledger["statements_per_cmd"] == 4.1  # 30 + 6 + 5 over 10 commands; BEGIN apart
    assert ledger["all_toplevel_per_cmd"] == 5.1
    assert ledger["nested_per_cmd"] == 2.0
    top = ledger["top_by_calls"][0]
    assert top["name"] == "ledger/admit_command" and top["calls_per_cmd"] == 3.6
    assert top["query"] == "INSERT INTO agent_command VALUES ($1)"
    assert all("bench" not in r["query"] for r in ledger["top_by_calls"])
    assert ledger["bench_statements"] == 30
    assert summary["crm"]["statements_per_cmd"] == 0.7


def test_named_queries_are_found_by_their_start() -> None:
    catalog = {"a/one": "-- Take a command\nSELECT x FROM t WHERE id = $1 AND tenant_id = $2",
               "a/two": "-- Take a command, differently\nSELECT y FROM t"}
    assert pgcounters.name_of("-- Take a command\n  SELECT x FROM t WHERE id = $1 AND tenant_id"
                              " = $2", catalog) == "a/one"
    assert pgcounters.name_of("SELECT agentledger_xid_visible($1)", catalog) is None
    short = {"a/short": "SELECT 1"}
    assert pgcounters.name_of("SELECT 1", short) == "a/short"
    assert pgcounters.name_of("SELECT 1 FROM somewhere_else", short) is None


def test_counter_rows_and_wal_per_command() -> None:
    rows = pgcounters.diff_rows({"t": {"ins": 10, "upd": 4}},
                                {"t": {"ins": 30, "upd": 4}, "u": {"del": 5}}, 10)
    assert rows == {"t": {"ins": 2.0}, "u": {"del": 0.5}}
    records = [("16384", "Heap", "INSERT", 20, 2000, 0), ("16384", "Heap", "HEAP_CONFIRM", 10,
                                                          500, 0),
               ("16384", "Btree", "INSERT_LEAF", 40, 3000, 100), ("16384", "Heap", "LOCK", 5,
                                                                   200, 0),
               ("", "Transaction", "COMMIT", 10, 400, 0), ("0", "Heap", "INPLACE", 1, 10, 0),
               ("99", "Heap", "INSERT", 3, 30, 0)]
    wal = pgcounters.wal_summary(records, {16384: "ledger"}, 10)
    assert wal["ledger"]["decoded_changes_per_cmd"] == 3.0  # inserts + confirms, no locks
    assert wal["ledger"]["bytes_per_cmd"] == 570.0 and wal["ledger"]["fpi_bytes_per_cmd"] == 10.0
    assert wal["ledger"]["by_kind"]["Btree/INSERT_LEAF"] == 4.0
    assert wal["no_relation"]["records_per_cmd"] == 1.0
    assert set(wal) == {"ledger", "no_relation", "shared_catalog", "other_databases"}


def test_the_rest_counted_past_the_window_is_taken_off() -> None:
    # 100 commits in the window; the counters are read 11 s after it, while the system's
    # pollers commit 2 a second at rest (22 more), measured over the next 11 s.
    before = {"db": {"xact_commit": 1000}}
    after = {"db": {"xact_commit": 1122}}
    rest = {"db": {"xact_commit": 1144}}
    window = pgcounters.less_rest(after, rest, tail_s=11.0, rest_s=11.0)
    assert pgcounters.diff_rows(before, window, 50) == {"db": {"xact_commit": 2.0}}
    assert pgcounters.less_rest(after, {}, 11.0, 11.0) == {"db": {"xact_commit": 1122}}


def _box(box: float, services: float) -> dict[str, object]:
    return {"cpu_ms_per_cmd": {"box": box, "accounted": box - 1.0, "services": services,
                               "own_postgres": 1.0, "postgres": 2.0, "kafka": 0.5},
            "load_avg_before": [1.0, 1.0, 1.0], "load_avg_after": [2.0, 1.0, 1.0],
            "statements": {"ledger": {"statements_per_cmd": 14.0,
                                      "top_by_calls": [{"query": "a | b", "toplevel": True,
                                                        "calls_per_cmd": 1.0,
                                                        "exec_ms_per_cmd": 0.1,
                                                        "name": None}]},
                           "peer_app": {"statements_per_cmd": 2.0},
                           "peer_system": {"statements_per_cmd": 6.0}}}


def test_the_headline_ratio_is_peer_box_over_ours() -> None:
    details = {"e2e": {"burst": {"box": _box(10.0, 5.0)}},
               "peer": {"burst": {"box": _box(15.0, 9.0)}}}
    f = boxreport.figures(details)
    assert f["box_cpu_ms_per_cmd"] == 10.0 and f["peer_box_cpu_ms_per_cmd"] == 15.0
    assert f["box_cpu_ratio_peer_to_ours"] == 1.5
    assert f["box_accounted_cpu_ratio_peer_to_ours"] == round(14 / 9, 3)
    assert f["ledger_statements_per_cmd"] == 14.0 and f["peer_statements_per_cmd"] == 8.0
    text = "\n".join(boxreport.markdown(f, details))
    assert "| 10.0 | 15.0 | 1.500 |" in text
    assert "a ¦ b" in text  # a statement's | would break the table
    assert boxreport.figures({})["box_cpu_ratio_peer_to_ours"] is None


def test_bars_pass_fail_goal_and_not_measured() -> None:
    rows = {r["figure"]: r for r in bars.evaluate({
        "box_cpu_ms_per_cmd": 2.8, "box_cpu_ratio_peer_to_ours": 5.2,
        "kafka_cpu_ms_per_cmd": 0.4, "relay_rate_achieved_1000": 423.0})}
    assert rows["box_cpu_ms_per_cmd"]["status"] == "pass"
    assert rows["box_cpu_ms_per_cmd"]["goal_met"] is False
    assert rows["box_cpu_ratio_peer_to_ours"]["goal_met"] is True
    assert rows["kafka_cpu_ms_per_cmd"]["status"] == "fail"
    assert rows["relay_rate_achieved_1000"]["status"] == "fail"
    assert rows["e2e_ms_p99"]["status"] == "not measured"
    assert rows[""]["status"] == "not measured" and "soak" in rows[""]["elsewhere"]
    table = "\n".join(bars.markdown(list(rows.values())))
    assert "| ≤ 3.1 | ≤ 2.5 | 2.800 | pass, goal not met |" in table


def test_a_busy_box_makes_the_whole_box_verdicts_inconclusive() -> None:
    figures = {"box_cpu_ms_per_cmd": 10.0, "box_other_cpu_ms_per_cmd": 0.5,
               "peer_box_cpu_ms_per_cmd": 60.0, "peer_box_other_cpu_ms_per_cmd": 30.0,
               "box_cpu_ratio_peer_to_ours": 6.0, "services_cpu_ms_per_cmd": 1.0,
               "ledger_statements_per_cmd": 16.0}
    assert bars.others_share(figures) == {"ours": 0.05, "peer": 0.5}
    rows = {r["figure"]: r for r in bars.evaluate(figures)}
    assert rows["box_cpu_ratio_peer_to_ours"]["status"] == "pass"
    assert rows["box_cpu_ratio_peer_to_ours"]["note"].startswith("inconclusive")
    assert "peer's burst" in rows["box_cpu_ratio_peer_to_ours"]["note"]
    assert rows["services_cpu_ms_per_cmd"]["note"].startswith("box busy")
    assert rows["e2e_ms_p99"]["note"] == ""  # not measured
    assert rows["ledger_statements_per_cmd"]["note"] == ""  # a count: the same on a busy box
    quiet = dict(figures, peer_box_other_cpu_ms_per_cmd=3.0)
    assert all(r["note"] == "" for r in bars.evaluate(quiet))


def test_report_carries_the_box_figures_and_the_load_average() -> None:
    run = {"started_at": "now", "duration_s": 1.0, "git_commit": "abc", "host_cpus": 2,
           "load_avg_start": "0.10 0.20 0.30", "load_avg_end": "4.00 2.00 1.00"}
    details = {"e2e": {"burst": {"box": _box(10.0, 5.0)}}}
    f = report.figures(details, run)
    assert f["load_avg_start"] == "0.10 0.20 0.30" and f["box_cpu_ms_per_cmd"] == 10.0
    text = report.markdown({"run": run, "figures": f, "errors": {}, "details": details})
    assert "## Bars" in text and "## The whole box per command" in text
