"""Runs the DBOS Transact peer (:mod:`bench.peer_dbos`) through the same workload.

Two peer processes (like our two executors) share one Kafka consumer group and one DBOS
system database; the intent table lives in a second database; the CRM is a fresh instance
of the same CRM service. If DBOS cannot run here, the error is reported, never a number.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from agentledger.testing import ledger as testing_ledger
from agentledger.testing import processes
from agentledger.testing.crm import run_crm
from agentledger.testing.polling import wait_until
from bench import databases, e2e, meter, procstats, workload

INSTANCES = 2
FINISHED_SQL = (
    "SELECT operation_id::text, extract(epoch FROM finished_at) FROM peer_command"
    " WHERE operation_id = ANY(%s::uuid[]) AND state = 'succeeded'"
)


def _start(stack: ExitStack, base_env: dict[str, str], logs: Path, bootstrap: str,
           group: str, *, batch: int, tag: str) -> dict[str, int]:
    """Start the peer's instances (Kafka batches of ``batch``) in one group; their pids."""
    pids: dict[str, int] = {}
    for i in range(1, INSTANCES + 1):
        env = {**base_env, "BENCH_PEER_EXECUTOR_ID": f"peer-{i}",
               "BENCH_PEER_KAFKA_BATCH": str(batch)}
        log = logs / f"peer-{i}{tag}.log"
        svc = stack.enter_context(processes.running(
            "bench.peer_dbos", env, log, timeout=90,
            ready=lambda log=log: "event=peer_ready" in log.read_text(errors="replace")))
        pids[f"peer-{i}"] = svc.proc.pid if svc.proc else 0
    if not wait_until(lambda: e2e.group_members(bootstrap, group) >= INSTANCES,
                      timeout=e2e.JOIN_TIMEOUT):
        raise RuntimeError("the peer instances did not join one consumer group")
    return pids


def version() -> str | None:
    try:
        from importlib.metadata import version as dist_version

        return f"dbos {dist_version('dbos')}"
    except Exception:
        return None


def run(bootstrap: str, dbs: databases.Databases, logs: Path, *, burst_size: int,
        steady_s: float, timeout: float) -> dict[str, Any]:
    """Measure the peer; ``{"error": ...}`` when it cannot run."""
    if version() is None:
        return {"error": "the dbos package is not installed (pip install 'dbos>=1.0')"}
    import dbos  # noqa: F401  -- fail here, with the import error, if it cannot load

    from bench.peer_dbos import BATCH, CONCURRENCY, INTENT_TABLE, POLL_S, POOL

    tag = uuid.uuid4().hex[:8]
    topic, group = f"bench{tag}.agent.proposals.v1", f"bench-peer-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    created[topic].result(30)
    system_db, app_db = dbs.empty("dbos_sys"), dbs.empty("dbos_app")
    databases.admin_exec(app_db, INTENT_TABLE)
    try:
        with ExitStack() as stack:
            crm_db = dbs.fresh("peer_crm")
            crm = stack.enter_context(run_crm(crm_db, logs, faults_enabled="true"))
            tenant, customer = str(uuid.uuid4()), f"c-{tag}"
            asyncio.run(crm.customer(tenant, customer, email="ada@example.com"))
            token = asyncio.run(crm.token(tenant, "write"))
            base_env = {"BENCH_PEER_SYSTEM_DB": system_db, "BENCH_PEER_APP_DB": app_db,
                        "BENCH_PEER_BOOTSTRAP": bootstrap, "BENCH_PEER_TOPIC": topic,
                        "BENCH_PEER_GROUP": group, "BENCH_PEER_CRM_URL": crm.url,
                        "BENCH_PEER_TOKENS": json.dumps({tenant: token})}
            crm_pid = procstats.child_pid("agentledger.services.crm")
            crm_cpu = procstats.Group({"crm": crm_pid} if crm_pid else {})
            before = crm_cpu.cpu()
            target = workload.Target(bootstrap, topic, tenant, customer, app_db, FINISHED_SQL)

            # Throughput with batches of BATCH records (what DBOS needs to go fast) ...
            with ExitStack() as peers:
                pids = _start(peers, base_env, logs, bootstrap, group, batch=BATCH, tag="")
                side = meter.Side("peer", pids, crm_pid, {
                    e2e.database_name(system_db): "peer_system",
                    e2e.database_name(app_db): "peer_app",
                    e2e.database_name(crm_db): "crm"}, own_roles=("peer_system", "peer_app"))
                meter_url = dbs.meter_url()
                result = workload.measure(
                    target, burst_size=burst_size, steady_s=steady_s, timeout=timeout,
                    processes=procstats.Group(pids), slow=e2e.slow_provider(crm),
                    box=lambda: meter.Meter(meter_url, bootstrap, side))
            # ... and latency with one record per batch, at the same offered rate: DBOS's
            # consumer waits up to 1 s to fill a batch (``consume(n, timeout=1.0)``), which
            # at the steady trickle would be most of its latency. Each figure is the peer's
            # best, so neither ratio is against a handicapped peer.
            result["steady_batch"] = result.pop("steady")
            rate = result["steady_batch"]["rate_offered_per_s"]
            with ExitStack() as peers:
                _start(peers, base_env, logs, bootstrap, group, batch=1, tag="-lat")
                warm = workload.wait_finished(
                    target, list(workload.produce(target, 20)), timeout)
                result["latency_warmup_completed"] = len(warm)
                result["steady"] = workload.steady(target, rate, steady_s, timeout)
            result["crm_cpu_s"] = {n: round(c - before.get(n, 0.0), 1)
                                   for n, c in crm_cpu.cpu().items()}
    except Exception as exc:  # reported with the run's other figures, never hidden
        return {"error": f"{type(exc).__name__}: {exc}"[:2000],
                "logs": str(logs), "python": sys.version.split()[0]}
    finally:
        testing_ledger.delete_namespace_topics(admin, f"bench{tag}.")
        e2e.forget_groups(bootstrap, [group])
    result["config"] = {"instances": INSTANCES, "queue_worker_concurrency": CONCURRENCY,
                        "queue_polling_interval_s": POLL_S, "kafka_batch_size": BATCH,
                        "kafka_batch_size_for_latency": 1,
                        "isolation": "READ COMMITTED", "version": version(),
                        "sql": "idempotent @DBOS.step functions (no datasource transactions)",
                        "pools": POOL, "http_client": "urllib3"}
    return result
