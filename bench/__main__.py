"""``python -m bench``: every figure of SPEC §12 in one run, written to bench/results/.

    . .local/env && .venv/bin/python -m bench            # ~6-9 minutes on 2 cores
    .venv/bin/python -m bench --quick                    # smaller bursts, for trying it out
    .venv/bin/python -m bench --profile                  # also py-spy the hot services

Phases run one after another (never concurrently: they would measure each other), each on
fresh databases and topics; a failed phase is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentledger import settings
from bench import (
    admission,
    crm,
    databases,
    e2e,
    http_clients,
    peer,
    pg_limit,
    profile,
    relay_lag,
    report,
)

RESULTS = Path(__file__).resolve().parent / "results"
_ONLY: set[str] = set()  # --only: the phases to run (empty: every phase)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                          cwd=settings.REPO_ROOT)
    return done.stdout.strip()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _phase(name: str, details: dict[str, Any], errors: dict[str, str],
           fn: Callable[[], dict[str, Any]]) -> None:
    if _ONLY and name not in _ONLY:
        return
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    began = time.monotonic()
    try:
        details[name] = fn()
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc()
    took = round(time.monotonic() - began, 1)
    if isinstance(details.get(name), dict):
        details[name]["phase_s"] = took
    print(f"bench: {name} done in {took} s", file=sys.stderr, flush=True)


def stack_problem(database_url: str, bootstrap: str) -> str | None:
    """Why the stack cannot be benchmarked (Postgres or Kafka not answering), or None."""
    import logging

    import psycopg2
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        psycopg2.connect(database_url, connect_timeout=3).close()
    except psycopg2.Error as exc:
        where = database_url.rsplit("@", 1)[-1]
        return f"PostgreSQL at {where} does not answer ({str(exc).strip().splitlines()[0]})"
    quiet = logging.getLogger("bench.preflight")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False  # librdkafka's connection errors would print a line each
    try:
        AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 3000},
                    logger=quiet).list_topics(timeout=5)
    except KafkaException:
        return f"Kafka at {bootstrap} does not answer"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller bursts and shorter phases")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the admission service and an executor during their bursts")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--only", default="",
                        help="comma-separated phases to run (http_clients, crm, pg_limit, "
                             "admission, admission_service, relay_lag, relay_lag_1000, e2e, peer); "
                             "default: all")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    _ONLY.update(filter(None, args.only.split(",")))
    # Phase lengths: long enough for a steady state on this box, short enough for ~8 min.
    burst = 300 if args.quick else 900
    seconds = 3.0 if args.quick else 6.0
    steady_s = 8.0 if args.quick else 15.0
    curve_s = 4.0 if args.quick else 8.0  # per step of the load curve
    timeout = 180.0

    common = settings.load()
    problem = stack_problem(common.database_url, common.kafka_bootstrap)
    if problem:
        print(f"bench: the stack is not up: {problem}; start it with `make up`",
              file=sys.stderr)
        return 2
    started, began = datetime.now(UTC), time.monotonic()
    load_start = _load()
    tag = uuid.uuid4().hex[:6]
    logs = Path(tempfile.mkdtemp(prefix=f"al_bench_{tag}_"))
    profiles: Path | None = (args.out / "profiles") if args.profile else None
    if profiles is not None:
        profiles.mkdir(parents=True, exist_ok=True)
    details: dict[str, Any] = {}
    errors: dict[str, str] = {}
    boot = common.kafka_bootstrap
    _phase("http_clients", details, errors, http_clients.run)
    with databases.Databases(common.database_url, tag) as dbs:
        _phase("crm", details, errors,
               lambda: crm.run(dbs.fresh("crm"), 1000 if args.quick else 3000))
        _phase("pg_limit", details, errors, lambda: pg_limit.run(dbs.fresh("pg"), seconds))
        _phase("admission", details, errors,
               lambda: admission.library(dbs.fresh("adm"), seconds))
        _phase("admission_service", details, errors, lambda: admission.service(
            boot, dbs.fresh("svc"), dbs.fresh("svc_crm"), logs, count=burst, timeout=timeout,
            profile_to=profiles / "admission.raw" if profiles else None))
        _phase("relay_lag", details, errors, lambda: relay_lag.run(
            seconds=steady_s, rate=200.0, database_url=dbs.fresh("relay")))
        _phase("relay_lag_1000", details, errors, lambda: relay_lag.run(
            seconds=steady_s / 2, rate=1000.0, database_url=dbs.fresh("relay_fast")))
        _phase("e2e", details, errors, lambda: e2e.run(
            boot, dbs.fresh("e2e"), dbs.fresh("e2e_crm"), logs, burst_size=burst,
            steady_s=steady_s, timeout=timeout, curve_s=curve_s,
            profile_to=profiles / "executor.raw" if profiles else None,
            meter_url=dbs.meter_url()))
        if not args.skip_peer:
            _phase("peer", details, errors, lambda: peer.run(
                boot, dbs, logs, burst_size=burst, steady_s=steady_s, timeout=timeout))
    if profiles is not None:
        for raw in sorted(profiles.glob("*.raw")):
            summary = profile.summarise(raw.read_text())
            raw.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
            details.setdefault("profiles", {})[raw.stem] = summary
    result: dict[str, Any] = {
        "run": {
            "started_at": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - began, 1),
            "git_commit": _git("rev-parse", "--short", "HEAD"),
            "git_dirty_tracked_files": len(_git("status", "--porcelain", "-uno").splitlines()),
            "host_cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_start": load_start, "load_avg_end": _load(),
            "options": {"burst": burst, "pgbench_and_library_s": seconds, "steady_s": steady_s,
                        "curve_step_s": curve_s,
                        "quick": args.quick},
            "logs": str(logs),
        },
        "figures": {},
        "errors": errors,
        "details": details,
    }
    result["figures"] = report.figures(details, result["run"])
    for path in report.write(result, args.out):
        print(f"bench: wrote {path}", file=sys.stderr)
    print(json.dumps(result["figures"], indent=1, default=str))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
