"""The run's headline figures and ratios, and their JSON, Markdown and PNG forms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import bars, boxreport, stats

# (key, unit, what it is) in the order the table shows them.
ROWS: list[tuple[str, str, str]] = [
    ("box_cpu_ms_per_cmd", "CPU ms", "whole box (/proc/stat) per command, our burst"),
    ("peer_box_cpu_ms_per_cmd", "CPU ms", "whole box per command, the peer's burst"),
    ("box_cpu_ratio_peer_to_ours", "ratio", "peer ÷ ours, whole box per command (headline)"),
    ("box_accounted_cpu_ratio_peer_to_ours", "ratio",
     "the same over the processes under test only (others' load left out)"),
    ("services_cpu_ms_per_cmd", "CPU ms", "our 6 services per command, burst"),
    ("ledger_pg_cpu_ms_per_cmd", "CPU ms",
     "the ledger database's backends + walsender + autovacuum per command"),
    ("kafka_cpu_ms_per_cmd", "CPU ms", "the broker per command, our burst"),
    ("ledger_statements_per_cmd", "stmts",
     "top-level statements on the ledger per command (BEGIN/COMMIT apart)"),
    ("ledger_statements_all_per_cmd", "stmts", "the same with BEGIN/COMMIT"),
    ("ledger_commits_per_cmd", "commits", "ledger database commits per command"),
    ("wal_bytes_per_cmd", "bytes", "WAL per command, whole cluster, our burst"),
    ("peer_wal_bytes_per_cmd", "bytes", "the same for the peer"),
    ("decoded_changes_per_published_row", "ratio",
     "heap changes the ledger's walsender decodes per row the relay publishes"),
    ("pg_limit_tps", "tx/s", "pgbench, seed admission tx (ledger + outbox), best of 1/8/32"),
    ("pg_limit_full_tps", "tx/s", "pgbench, every statement of the admission tx, RLS role"),
    ("admission_tps", "adm/s", "Admitter.admit in-process, best of 1/8/32 tasks"),
    ("admission_ratio", "ratio", "admission_tps / pg_limit_tps"),
    ("admission_ratio_full", "ratio", "admission_tps / pg_limit_full_tps"),
    ("admission_service_tps", "adm/s", "admission service: proposals on Kafka → results on Kafka"),
    ("admission_service_ratio", "ratio", "admission_service_tps / pg_limit_tps"),
    ("relay_lag_ms_p50", "ms", "commit → Kafka ack, 200 admissions/s offered"),
    ("relay_lag_ms_p99", "ms", "commit → Kafka ack, 200 admissions/s offered"),
    ("relay_lag_ms_p99_1000", "ms", "commit → Kafka ack, 1,000 admissions/s offered"),
    ("relay_rate_achieved_1000", "adm/s", "admissions/s the 1,000/s phase achieved"),
    ("relay_records_per_s_1000", "rec/s", "records the relay acknowledged per s, 1,000/s offered"),
    ("relay_cpu_ms_per_record", "ms", "relay process CPU per published record, 200/s offered"),
    ("e2e_cmds_per_s", "cmd/s", "proposal → CRM note → outcome persisted, 2 executors"),
    ("e2e_ms_p50", "ms", "proposal produced → ledger finished_at, at half that rate"),
    ("e2e_ms_p99", "ms", "proposal produced → ledger finished_at, at half that rate"),
    ("e2e_cmds_per_s_slow_provider", "cmd/s", "same, CRM delays every note by 200 ms"),
    ("e2e_slow_to_fast", "ratio", "e2e_cmds_per_s_slow_provider / e2e_cmds_per_s"),
    ("e2e_ratio_to_pg_limit", "ratio", "e2e_cmds_per_s / pg_limit_tps"),
    ("peer_name", "", "the peer engine"),
    ("peer_cmds_per_s", "cmd/s", "peer, same workload, 2 instances"),
    ("peer_ms_p50", "ms", "peer, proposal produced → receipt persisted"),
    ("peer_ms_p99", "ms", "peer, proposal produced → receipt persisted"),
    ("peer_cmds_per_s_slow_provider", "cmd/s", "peer, CRM delays every note by 200 ms"),
    ("ours_to_peer_cmds_per_s", "ratio", "e2e_cmds_per_s / peer_cmds_per_s (>1: we are faster)"),
    ("ours_to_peer_slow_provider", "ratio", "the same with the slow CRM"),
    ("ours_to_peer_ms_p50", "ratio", "e2e_ms_p50 / peer_ms_p50 (<1: we are faster)"),
    ("ours_to_peer_ms_p99", "ratio", "e2e_ms_p99 / peer_ms_p99 (<1: we are faster)"),
    ("e2e_cpu_s_per_1000", "CPU s", "our services' CPU per 1,000 commands (burst)"),
    ("peer_cpu_s_per_1000", "CPU s", "the peer's CPU per 1,000 commands (burst)"),
    ("admission_library_cpu_s_per_1000", "CPU s", "in-process Admitter CPU per 1,000 admissions"),
    ("admission_service_cpu_s_per_1000", "CPU s", "admission service CPU per 1,000 admissions"),
    ("e2e_postgres_cpu_s_per_1000", "CPU s",
     "the Postgres cluster's CPU per 1,000 commands (ours)"),
    ("peer_postgres_cpu_s_per_1000", "CPU s", "the same for the peer"),
    ("e2e_commits_per_cmd", "commits", "transactions Postgres committed per command (ours)"),
    ("peer_commits_per_cmd", "commits", "the same for the peer"),
    ("e2e_kafka_cpu_s_per_1000", "CPU s", "the Kafka broker's CPU per 1,000 commands (ours)"),
    ("peer_kafka_cpu_s_per_1000", "CPU s", "the same for the peer"),
    ("http_httpx_cpu_ms", "CPU ms", "httpx: client CPU per keep-alive GET, 32 in flight"),
    ("http_aiohttp_cpu_ms", "CPU ms", "aiohttp (connectors, resolvers): the same"),
    ("crm_note_cpu_ms", "CPU ms", "CRM stand-in CPU per note (keyed, fenced), 16 in flight"),
    ("crm_read_cpu_ms", "CPU ms", "CRM stand-in CPU per revision read (2 ids), 16 in flight"),
]


def _get(d: dict[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def figures(details: dict[str, Any], run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headline figures from the phases' details (missing phases give None)."""
    pg, adm = details.get("pg_limit"), details.get("admission")
    svc = details.get("admission_service")
    relay, e2e, peer = details.get("relay_lag"), details.get("e2e"), details.get("peer")
    f: dict[str, Any] = {
        "pg_limit_tps": _get(pg, "pg_limit_tps"),
        "pg_limit_full_tps": _get(pg, "pg_limit_full_tps"),
        "admission_tps": _get(adm, "admission_tps"),
        "admission_service_tps": _get(svc, "admission_service_tps"),
        "relay_lag_ms_p50": _get(relay, "lag_ms", "p50"),
        "relay_lag_ms_p99": _get(relay, "lag_ms", "p99"),
        "relay_lag_ms_p99_1000": _get(details.get("relay_lag_1000"), "lag_ms", "p99"),
        "relay_rate_achieved_1000": _get(details.get("relay_lag_1000"), "rate_achieved_per_s"),
        "relay_records_per_s_1000": _get(details.get("relay_lag_1000"), "relay_records_per_s"),
        "relay_cpu_ms_per_record": _get(relay, "relay_cpu_ms_per_record"),
        "e2e_cmds_per_s": _get(e2e, "burst", "cmds_per_s"),
        "e2e_ms_p50": _get(e2e, "steady", "ms_p50"),
        "e2e_ms_p99": _get(e2e, "steady", "ms_p99"),
        "e2e_cmds_per_s_slow_provider": _get(e2e, "burst_slow_provider", "cmds_per_s"),
        "peer_name": None if _get(peer, "error") else _get(peer, "config", "version"),
        "peer_cmds_per_s": _get(peer, "burst", "cmds_per_s"),
        "peer_ms_p50": _get(peer, "steady", "ms_p50"),
        "peer_ms_p99": _get(peer, "steady", "ms_p99"),
        "peer_cmds_per_s_slow_provider": _get(peer, "burst_slow_provider", "cmds_per_s"),
        "peer_error": _get(peer, "error"),
        "e2e_cpu_s_per_1000": _get(e2e, "burst", "cpu_s_per_1000"),
        "peer_cpu_s_per_1000": _get(peer, "burst", "cpu_s_per_1000"),
        "admission_library_cpu_s_per_1000": min(
            (r["cpu_s_per_1000"] for r in _get(adm, "admission_library") or []
             if r.get("cpu_s_per_1000") is not None), default=None),
        "admission_service_cpu_s_per_1000": _get(svc, "admission_service", "cpu_s_per_1000"),
        "e2e_postgres_cpu_s_per_1000": _get(e2e, "burst", "infra_cpu_s_per_1000", "postgres"),
        "peer_postgres_cpu_s_per_1000": _get(peer, "burst", "infra_cpu_s_per_1000", "postgres"),
        "e2e_commits_per_cmd": _get(e2e, "burst", "commits_per_cmd"),
        "peer_commits_per_cmd": _get(peer, "burst", "commits_per_cmd"),
        "e2e_kafka_cpu_s_per_1000": _get(e2e, "burst", "infra_cpu_s_per_1000", "kafka"),
        "peer_kafka_cpu_s_per_1000": _get(peer, "burst", "infra_cpu_s_per_1000", "kafka"),
        "http_httpx_cpu_ms": _get(details.get("http_clients"), "http_client_cpu_ms_per_request",
                                  "httpx"),
        "http_aiohttp_cpu_ms": _get(details.get("http_clients"),
                                    "http_client_cpu_ms_per_request", "aiohttp"),
        "crm_note_cpu_ms": _get(details.get("crm"), "note", "cpu_ms_per_request"),
        "crm_read_cpu_ms": _get(details.get("crm"), "read", "cpu_ms_per_request"),
    }
    f["admission_ratio"] = stats.ratio(f["admission_tps"], f["pg_limit_tps"])
    f["admission_ratio_full"] = stats.ratio(f["admission_tps"], f["pg_limit_full_tps"])
    f["admission_service_ratio"] = stats.ratio(f["admission_service_tps"], f["pg_limit_tps"])
    f["e2e_slow_to_fast"] = stats.ratio(f["e2e_cmds_per_s_slow_provider"], f["e2e_cmds_per_s"])
    f["e2e_ratio_to_pg_limit"] = stats.ratio(f["e2e_cmds_per_s"], f["pg_limit_tps"])
    f["ours_to_peer_cmds_per_s"] = stats.ratio(f["e2e_cmds_per_s"], f["peer_cmds_per_s"])
    f["ours_to_peer_slow_provider"] = stats.ratio(f["e2e_cmds_per_s_slow_provider"],
                                                  f["peer_cmds_per_s_slow_provider"])
    f["ours_to_peer_ms_p50"] = stats.ratio(f["e2e_ms_p50"], f["peer_ms_p50"])
    f["ours_to_peer_ms_p99"] = stats.ratio(f["e2e_ms_p99"], f["peer_ms_p99"])
    rss: dict[str, Any] = {}
    for phase in ("e2e", "peer"):
        rss.update(_get(details.get(phase), "peak_rss_mb") or {})
    rss["crm"] = _get(e2e, "crm_peak_rss_mb", "crm")
    rss["admission (alone)"] = _get(svc, "admission_service", "peak_rss_mb")
    rss["relay (lag phase)"] = _get(relay, "relay_peak_rss_mb")
    f["peak_rss_mb"] = {k: v for k, v in rss.items() if v is not None}
    f.update(boxreport.figures(details))
    f["load_avg_start"] = _get(run, "load_avg_start")
    f["load_avg_end"] = _get(run, "load_avg_end")
    return f


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def markdown(result: dict[str, Any]) -> str:
    f, run = result["figures"], result["run"]
    lines = [
        "# agentledger benchmark — latest run", "",
        f"{run['started_at']} · {run['duration_s']} s · commit `{run['git_commit']}`"
        f" · {run['host_cpus']} CPUs · load {run['load_avg_start']} → {run['load_avg_end']}", "",
    ]
    lines += ["## Bars (issue 41; a benchmark, not a test)", ""]
    lines += bars.markdown(bars.evaluate(f))
    lines += boxreport.markdown(f, result.get("details", {}))
    lines += ["", "## Every figure", "", "| figure | value | unit | what |",
              "| --- | ---: | --- | --- |"]
    lines += [f"| `{k}` | {_cell(f.get(k))} | {u} | {w} |" for k, u, w in ROWS]
    lines += ["", "Peak RSS per process (MiB):", "",
              "| process | MiB |", "| --- | ---: |"]
    lines += [f"| {n} | {_cell(v)} |" for n, v in sorted(f["peak_rss_mb"].items())]
    curve = _get(result.get("details", {}).get("e2e"), "load_curve")
    if curve:
        lines += ["", "Load curve, end to end (offered rate as a share of the burst rate; "
                  "completed rate over each step's span):", "",
                  "| share | offered /s | completed /s | completed | p50 ms | p99 ms |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {p['share']} | {_cell(p['offered_per_s'])} | "
                  f"{_cell(p['completed_per_s'])} | {p['completed']}/{p['offered']} | "
                  f"{_cell(p['ms_p50'])} | {_cell(p['ms_p99'])} |" for p in curve]
    stages = _get(result.get("details", {}).get("e2e"), "steady", "stages_ms")
    if stages:
        lines += ["", "Where the steady phase's latency goes (each stage ends when the transaction "
                  "recording its milestone began; database clock):", "",
                  "| stage | p50 ms | p99 ms |", "| --- | ---: | ---: |"]
        lines += [f"| {name} | {_cell(v['p50'])} | {_cell(v['p99'])} |"
                  for name, v in stages.items()]
    if f.get("peer_error"):
        lines += ["", f"Peer not measured: `{f['peer_error']}`"]
    errors = {k: v for k, v in result.get("errors", {}).items() if v}
    if errors:
        lines += ["", "Phases that failed:", ""] + [f"- {k}: `{v}`" for k, v in errors.items()]
    lines += ["", "How to read these figures: bench/README.md.", ""]
    return "\n".join(lines)


def chart(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = result["figures"]
    rates = [("Postgres\nseed tx", f["pg_limit_tps"]),
             ("Postgres\nadmit stmts", f["pg_limit_full_tps"]),
             ("admission\nlibrary", f["admission_tps"]),
             ("admission\nservice", f["admission_service_tps"]),
             ("e2e", f["e2e_cmds_per_s"]), ("e2e\nslow CRM", f["e2e_cmds_per_s_slow_provider"]),
             ("peer", f["peer_cmds_per_s"]), ("peer\nslow CRM", f["peer_cmds_per_s_slow_provider"])]
    lat = [("relay lag", f["relay_lag_ms_p50"], f["relay_lag_ms_p99"]),
           ("e2e", f["e2e_ms_p50"], f["e2e_ms_p99"]),
           ("peer", f["peer_ms_p50"], f["peer_ms_p99"])]
    fig, (left, right, box) = plt.subplots(1, 3, figsize=(17, 5),
                                           gridspec_kw={"width_ratios": [2, 1, 1]})
    colours = ["#888888"] * 2 + ["#1f77b4"] * 4 + ["#ff7f0e"] * 2
    left.bar([n for n, _ in rates], [v or 0 for _, v in rates], color=colours)
    left.set_yscale("log")
    left.set_ylabel("per second (log scale)")
    left.set_title("Throughput: grey = Postgres limit, blue = agentledger, orange = peer")
    for i, (_, v) in enumerate(rates):
        left.annotate("n/a" if v is None else f"{v:,.0f}", (i, v or 1), ha="center",
                      va="bottom", fontsize=8)
    xs = range(len(lat))
    right.bar([x - 0.2 for x in xs], [p50 or 0 for _, p50, _ in lat], width=0.4, label="p50")
    right.bar([x + 0.2 for x in xs], [p99 or 0 for _, _, p99 in lat], width=0.4, label="p99")
    right.set_xticks(list(xs), [n for n, _, _ in lat])
    right.set_ylabel("ms")
    right.set_title("Latency")
    right.legend()
    _box_chart(box, f)
    run = result["run"]
    fig.suptitle(f"agentledger bench · {run['started_at']} · {run['host_cpus']} CPUs, shared box",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _box_chart(ax: Any, f: dict[str, Any]) -> None:
    """Whole-box CPU per command, ours and the peer's, stacked by part."""
    def parts(p: str) -> list[tuple[str, float]]:
        pg, own = f.get(f"{p}pg_cpu_ms_per_cmd") or 0.0, f.get(
            "ledger_pg_cpu_ms_per_cmd" if not p else "peer_own_pg_cpu_ms_per_cmd") or 0.0
        return [("system's processes", f.get(f"{p}services_cpu_ms_per_cmd") or 0.0),
                ("its Postgres DBs", own), ("other Postgres (CRM DB, background)", pg - own),
                ("Kafka", f.get(f"{p}kafka_cpu_ms_per_cmd") or 0.0),
                ("CRM stand-in", f.get(f"{p}crm_cpu_ms_per_cmd") or 0.0),
                ("load generator + meter", (f.get(f"{p}loadgen_cpu_ms_per_cmd") or 0.0)
                 + (f.get(f"{p}meter_cpu_ms_per_cmd") or 0.0)),
                ("other processes", f.get(f"{p}box_other_cpu_ms_per_cmd") or 0.0)]

    sides = [("ours", parts("")), ("peer", parts("peer_"))]
    for i, (label, _) in enumerate(sides[0][1]):
        bottoms = [sum(v for _, v in s[1][:i]) for s in sides]
        ax.bar([s[0] for s in sides], [s[1][i][1] for s in sides], bottom=bottoms, label=label)
    for x, (_, p) in enumerate(sides):
        top = sum(v for _, v in p)
        ax.annotate(f"{top:.2f}", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("CPU-ms per command (burst)")
    ax.set_title("Whole box per command")
    ax.legend(fontsize=7)


def write(result: dict[str, Any], directory: Path, name: str = "latest") -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{name}.json", directory / f"{name}.md", directory / f"{name}.png"]
    paths[0].write_text(json.dumps(result, indent=2, sort_keys=False, default=str) + "\n")
    paths[1].write_text(markdown(result))
    chart(result, paths[2])
    return paths
