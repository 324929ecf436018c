"""The benchmark's arithmetic and report shapes (no I/O; figures are never asserted)."""

from __future__ import annotations

from bench import pg_limit, profile, report, stats


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 0.50) == 50.0
    assert stats.percentile(values, 0.99) == 99.0
    assert stats.percentile(values, 1.0) == 100.0
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None


def test_steady_rate_ignores_the_ramp_and_the_tail() -> None:
    # 100 events one every 10 ms, then a straggler 5 s later: the rate is still ~100/s.
    times = [i * 0.01 for i in range(100)] + [6.0]
    rate = stats.steady_rate(times)
    assert rate is not None and 95 < rate < 105
    assert stats.steady_rate([1.0] * 5) is None
    assert stats.steady_rate([1.0] * 20) is None


def test_ratio_and_latencies() -> None:
    assert stats.ratio(50.0, 200.0) == 0.25
    assert stats.ratio(None, 1.0) is None
    assert stats.ratio(1.0, 0.0) is None
    assert stats.latencies_ms({"a": 1.0, "b": 2.0}, {"a": 1.25}) == [250.0]


def test_pgbench_scripts_bind_every_parameter_and_no_comment() -> None:
    for script in (pg_limit.seed_script(), pg_limit.full_script()):
        assert "$" not in script
        assert "--" not in script
        assert "INSERT INTO agent_command" in script and "INSERT INTO command_outbox" in script
    assert "INSERT INTO event_outbox" in pg_limit.full_script()
    assert pg_limit.parse("latency average = 1.5 ms\ntps = 123.4 (without initial connection time)\n") \
        == (123.4, 1.5)


def test_profile_summary_counts_self_and_our_frames() -> None:
    collapsed = ("main (runpy.py:1);admit (agentledger/admission.py:9);execute (asyncpg/c.py:3) 3\n"
                 "main (runpy.py:1);select (selectors.py:5) 1\n")
    summary = profile.summarise(collapsed)
    assert summary["samples"] == 4
    assert summary["self_pct"][0] == ["execute (c.py)", 75.0]
    assert summary["ours_inclusive_pct"] == [["admit (admission.py)", 75.0]]
    assert summary["self_by_package_pct"][0] == ["asyncpg", 75.0]


def test_figures_and_markdown_tolerate_missing_phases() -> None:
    details = {"pg_limit": {"pg_limit_tps": 1000.0, "pg_limit_full_tps": 800.0},
               "admission": {"admission_tps": 250.0, "admission_library": [{"cpu_s_per_1000": 1.5}]},
               "peer": {"error": "ImportError: no dbos"}}
    figures = report.figures(details)
    assert figures["admission_ratio"] == 0.25
    assert figures["e2e_cmds_per_s"] is None and figures["ours_to_peer_cmds_per_s"] is None
    assert figures["peer_name"] is None and figures["peer_error"] == "ImportError: no dbos"
    run = {"started_at": "now", "duration_s": 1.0, "git_commit": "abc", "host_cpus": 2,
           "load_avg_start": "0", "load_avg_end": "0"}
    text = report.markdown({"run": run, "figures": figures, "errors": {}})
    assert "| `admission_ratio` | 0.250 |" in text
    assert "Peer not measured" in text
