"""Admission throughput through agentledger's own code, as a library and as the service.

- library: ``Admitter.admit`` (identity envelope, allowlist, closed schema, Cedar policy on
  the principal directory, canonical hash, payload encryption, ``repository.admit`` with the
  recorded decision) from N concurrent tasks on one asyncpg pool, acting as
  ``agentledger_admission`` like the service. The target is resolved from memory
  (``MappingResolver``) so the figure is admission's own cost, not the CRM's.
- service: ``python -m agentledger.services.admission`` as a subprocess with the real CRM
  resolver; proposals are produced to Kafka and the admission results consumed back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from agentledger import admission, crypto, db
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import keys
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities, processes
from agentledger.testing import ledger as testing_ledger
from agentledger.testing.crm import run_crm
from bench import e2e, procstats, profile, stats, workload

CONCURRENCY = (1, 8, 32)
TENANTS = 16
CUSTOMER = "c-bench"


def proposal(tenant: uuid.UUID) -> ProposalV1:
    """Parsed from the wire form, as the service's handler does."""
    return ProposalV1.model_validate_json(workload.proposal(str(tenant), CUSTOMER, uuid.uuid4()))


@asynccontextmanager
async def admitter(url: str, pool_size: int) -> AsyncIterator[tuple[admission.Admitter,
                                                                     list[uuid.UUID]]]:
    """An ``Admitter`` as the service builds it (acting as ``agentledger_admission``, the
    pool without a reset round trip), over ``TENANTS`` warmed tenants with their principals;
    the target resolved from memory. Yields it and the tenants."""
    tenants = [uuid.uuid4() for _ in range(TENANTS)]
    for t in tenants:
        await identities.put_principals(url, t, identities.DEFAULT_PRINCIPALS)
    rules = allowlist.Allowlist.load()
    master = crypto.MasterKey.from_b64(base64.b64encode(os.urandom(32)).decode())
    pool = await db.create_pool(url, role="agentledger_admission", size=pool_size,
                                min_size=pool_size)
    try:
        admitter = admission.Admitter(
            pool=pool, allowlist=rules,
            resolver=MappingResolver({(t, "crm", CUSTOMER): None for t in tenants}),
            authorizer=policy_repo.CedarAuthorizer(),
            cipher=keys.PayloadCipher(master),
            envelope_keys=identities.KEYSET,
        )
        for t in tenants:  # first use creates each tenant's data key: not steady state
            await admitter.admit(proposal(t))
        yield admitter, tenants
    finally:
        await pool.close()


async def _library(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    async with admitter(url, concurrency) as (admit, tenants):
        counts: dict[str, int] = {}
        deadline = time.monotonic() + seconds

        async def worker(i: int) -> None:
            n = i
            while time.monotonic() < deadline:
                result = await admit.admit(proposal(tenants[n % TENANTS]))
                counts[result.status] = counts.get(result.status, 0) + 1
                n += 1

        cpu0, t0 = procstats.cpu_seconds(os.getpid()) or 0.0, time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.monotonic() - t0
        cpu = (procstats.cpu_seconds(os.getpid()) or 0.0) - cpu0
    admitted = counts.get("admitted", 0)
    return {"concurrency": concurrency, "admitted": admitted, "statuses": counts,
            "tps": round(admitted / elapsed, 1),
            "cpu_s_per_1000": procstats.cpu_per_1000({"p": 0.0}, {"p": cpu}, admitted)}


def library(url: str, seconds: float) -> dict[str, Any]:
    """``Admitter.admit`` at 1, 8 and 32 concurrent tasks; the best rate is ``admission_tps``."""
    runs = [asyncio.run(_library(url, c, seconds)) for c in CONCURRENCY]
    return {"admission_tps": max(r["tps"] for r in runs), "admission_library": runs}


def _results(bootstrap: str, topic: str, want: int, timeout: float) -> list[float]:
    """Record timestamps (s) of ``admitted`` results on ``topic``, until ``want`` or timeout."""
    group = f"bench-read-{uuid.uuid4().hex}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    stamps: list[float] = []
    deadline = time.monotonic() + timeout
    try:
        while len(stamps) < want and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is None and json.loads(msg.value()).get("status") == "admitted":
                    stamps.append(msg.timestamp()[1] / 1000.0)
    finally:
        consumer.close()
        e2e.forget_groups(bootstrap, [group])
    return stamps


def service(bootstrap: str, ledger_url: str, crm_url: str, logs: Path, *, count: int,
            timeout: float, profile_to: Path | None = None) -> dict[str, Any]:
    """The admission service as a subprocess: proposals in, admission results out."""
    tag = uuid.uuid4().hex[:8]
    ns, group = f"bench{tag}.", f"bench-admission-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        with run_crm(crm_url, logs) as crm:
            tenant, customer = str(uuid.uuid4()), f"c-{tag}"
            asyncio.run(crm.customer(tenant, customer, email="ada@example.com"))
            read_token = asyncio.run(crm.token(tenant, "read"))
            asyncio.run(identities.put_principals(ledger_url, tenant,
                                                  identities.DEFAULT_PRINCIPALS))
            env = {
                "AGENTLEDGER_DATABASE_URL": ledger_url, "AGENTLEDGER_KAFKA_BOOTSTRAP": bootstrap,
                "AGENTLEDGER_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
                "AGENTLEDGER_ADMISSION_CRM_URL": crm.url,
                "AGENTLEDGER_ADMISSION_CRM_READ_TOKENS": json.dumps({tenant: read_token}),
                "AGENTLEDGER_ADMISSION_GROUP_ID": group,
                "AGENTLEDGER_ADMISSION_PROPOSALS_TOPIC": ns + "agent.proposals.v1",
                "AGENTLEDGER_ADMISSION_ADMISSIONS_TOPIC": ns + "agent.admissions.v1",
                "AGENTLEDGER_ADMISSION_PARTITIONS": "3",
                "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS": json.dumps(identities.ENVELOPE_KEYS),
            }
            with processes.running("agentledger.services.admission", env,
                                   logs / "admission-only.log",
                                   ready=processes.group_has_members(bootstrap, group),
                                   timeout=90) as svc:
                pid = svc.proc.pid if svc.proc else 0
                target = workload.Target(bootstrap, ns + "agent.proposals.v1", tenant, customer,
                                         ledger_url, "")
                workload.produce(target, 20)  # warm-up: connections, the tenant's data key
                _results(bootstrap, ns + "agent.admissions.v1", 20, timeout)
                cpu0 = procstats.cpu_seconds(pid) or 0.0
                with profile.recording(pid, profile_to) if profile_to else nullcontext():
                    workload.produce(target, count)
                    stamps = _results(bootstrap, ns + "agent.admissions.v1", 20 + count, timeout)
                cpu = (procstats.cpu_seconds(pid) or 0.0) - cpu0
                burst = sorted(stamps)[20:]
                peak = procstats.peak_rss_mb(pid)
    finally:
        testing_ledger.delete_namespace_topics(admin, ns)
        e2e.forget_groups(bootstrap, [group])
    return {
        "admission_service_tps": stats.rounded(stats.steady_rate(burst)),
        "admission_service": {"offered": count, "admitted": len(burst),
                              "cpu_s_per_1000": procstats.cpu_per_1000(
                                  {"p": 0.0}, {"p": cpu}, len(burst)),
                              "peak_rss_mb": peak, "proposal_partitions": 3,
                              "resolver": "CRM over HTTP (real)"},
    }
