"""End to end: proposal on Kafka → admission → ledger → relay → 2 executors → CRM → outcome.

Every service runs as ``python -m agentledger.services.<name>`` through the e2e tests'
``pipeline`` (fresh database, namespaced topics, the CRM with fault injection), plus a
second executor for the ``crm`` connector in the same consumer group. The slow provider is
the CRM's ``delay`` fault on every note: 200 ms before each note is handled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka.admin import AdminClient

from agentledger.testing import processes
from agentledger.testing.crm import Crm
from agentledger.testing.pipeline import pipeline
from bench import meter, procstats, profile, workload

SLOW_PROVIDER_MS = 200
# Seconds for two executors to join one group and settle its partitions (a rebalance).
JOIN_TIMEOUT = 90.0
FINISHED_SQL = (
    "SELECT operation_id::text, extract(epoch FROM finished_at) FROM agent_command"
    " WHERE operation_id = ANY(%s::uuid[]) AND state = 'succeeded'"
)
# Where the steady phase's latency goes: each stage ends when the transaction recording its
# milestone began (admission's; the claim's; the pre-call mark's; the finalize's).
STAGES_SQL = (
    "SELECT c.operation_id::text, extract(epoch FROM c.created_at),"
    " extract(epoch FROM c.dispatched_at), extract(epoch FROM a.sent_at),"
    " extract(epoch FROM c.finished_at)"
    " FROM agent_command c JOIN command_attempt a USING (tenant_id, operation_id)"
    " WHERE c.operation_id = ANY(%s::uuid[]) AND c.state = 'succeeded' AND a.result = 'succeeded'"
)
STAGES = ("to_admission", "admission_to_claim", "claim_to_call", "call_to_finalize")


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def group_members(bootstrap: str, group: str) -> int:
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
    except Exception:
        return 0
    return len(desc.members) if str(desc.state).endswith("STABLE") else 0


def slow_provider(crm: Crm) -> Callable[[bool], None]:
    """Arms (True) or clears (False) the CRM's delay on every note."""
    def arm(on: bool) -> None:
        if on:
            asyncio.run(crm.arm({"match": {"method": "POST", "path_prefix": "/v1/customers/"},
                                   "action": "delay", "delay_ms": SLOW_PROVIDER_MS,
                                   "times": None}))
        else:
            asyncio.run(crm.disarm())
    return arm


def run(bootstrap: str, ledger_url: str, crm_url: str, logs: Path, *, burst_size: int,
        steady_s: float, timeout: float, profile_to: Path | None = None,
        curve_s: float = 0.0, meter_url: str | None = None) -> dict[str, Any]:
    """Measure the pipeline; returns the workload figures and the processes' costs (with
    ``meter_url``, each burst's whole-box cost: ``bench.meter``)."""
    with pipeline(bootstrap, ledger_url, crm_url, logs) as p:
        first = p.services["executor-crm"]
        group = first.env["AGENTLEDGER_EXECUTOR_GROUP_ID"]
        with processes.running(first.module, first.env, logs / "executor-crm-2.log",
                               ready=lambda: group_members(bootstrap, group) >= 2,
                               timeout=JOIN_TIMEOUT) as second:
            pids = {name: s.proc.pid for name, s in p.services.items() if s.proc}
            pids["executor-crm-2"] = second.proc.pid if second.proc else 0
            crm_pid = procstats.child_pid("agentledger.services.crm")
            ours = procstats.Group(pids)
            target = workload.Target(bootstrap, p.topic("agent.proposals.v1"), p.tenant,
                                     p.customer, ledger_url, FINISHED_SQL,
                                     stages_sql=STAGES_SQL, stage_names=STAGES)
            crm_cpu = procstats.Group({"crm": crm_pid} if crm_pid else {})
            before = crm_cpu.cpu()
            executor_pid = pids["executor-crm"]

            side = meter.Side("ours", pids, crm_pid, {
                database_name(ledger_url): "ledger", database_name(crm_url): "crm"},
                own_roles=("ledger",))

            def box() -> meter.Meter:
                assert meter_url is not None
                return meter.Meter(meter_url, bootstrap, side)

            def around_burst() -> AbstractContextManager[Any]:
                if profile_to is None:
                    return nullcontext()
                return profile.recording(executor_pid, profile_to)

            result = workload.measure(target, burst_size=burst_size, steady_s=steady_s,
                                      timeout=timeout, processes=ours, slow=slow_provider(p.crm),
                                      around_burst=around_burst,
                                      box=box if meter_url else None)
            result["crm_cpu_s"] = {n: round(c - before.get(n, 0.0), 1)
                                   for n, c in crm_cpu.cpu().items()}
            if curve_s > 0:
                result["load_curve"] = workload.load_curve(
                    target, result["burst"]["cmds_per_s"] or 10.0, curve_s, timeout)
            result["crm_peak_rss_mb"] = crm_cpu.peak_rss()
            result["topic_partitions"] = {"proposals": 3, "exec": 3}
        tag = p.ns.removeprefix("e2e").rstrip(".")
    forget_groups(bootstrap, [f"admission-{tag}", f"executor-crm-{tag}",
                              f"executor-billing-{tag}"])
    return result


def forget_groups(bootstrap: str, groups: list[str]) -> None:
    """Delete the run's consumer groups; members that just stopped may take a few seconds to
    leave, so a non-empty group is retried, and whatever remains is left to the broker."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    pending = list(groups)
    for _ in range(4):
        futures = admin.delete_consumer_groups(pending)
        pending = []
        for group, future in futures.items():
            try:
                future.result(10)
            except Exception as exc:
                if "NON_EMPTY" in str(exc) or "NOT_EMPTY" in str(exc):
                    pending.append(group)
        if not pending:
            return
        time.sleep(5)  # waiting for departed members' sessions to end, bounded above
