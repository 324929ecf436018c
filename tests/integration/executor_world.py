"""A ledger, a CRM and the library pieces of admission, executor and reconciler, wired for tests."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from agentledger import admission, crypto
from agentledger.approvals import repository as approvals
from agentledger.connectors import base
from agentledger.connectors import crm as crm_connectors
from agentledger.contracts.proposals import ProposalV1
from agentledger.executor import dispatcher, reconciler
from agentledger.ledger import keys
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities
from agentledger.testing.crm import Crm, run_crm

RULES = allowlist.Allowlist.load()


@dataclass
class Tenant:
    tenant_id: uuid.UUID
    customer_id: str
    write: str
    lookup: str


@dataclass
class World:
    """``pool`` acts as the executor role, ``admission_pool`` as admission, ``owner`` inspects."""

    crm: Crm
    pool: asyncpg.Pool
    admission_pool: asyncpg.Pool
    reconciler_pool: asyncpg.Pool
    owner: asyncpg.Pool
    master: crypto.MasterKey = field(default_factory=lambda: crypto.MasterKey(os.urandom(32)))
    directory: dict[tuple[uuid.UUID, str, str], str | None] = field(default_factory=dict)
    write_tokens: dict[str, dict[str, str]] = field(default_factory=lambda: {"crm": {}, "billing": {}})
    lookup_tokens: dict[str, dict[str, str]] = field(default_factory=lambda: {"crm": {}, "billing": {}})
    authorizer: policy_repo.CedarAuthorizer = field(default_factory=policy_repo.CedarAuthorizer)
    connectors: dict[str, base.Connector] = field(default_factory=dict)

    async def tenant(self, **contact: Any) -> Tenant:
        tenant_id, customer = uuid.uuid4(), f"c-{uuid.uuid4().hex[:8]}"
        record = await self.crm.customer(str(tenant_id), customer, **contact)
        async with self.owner.acquire() as conn:
            for principal, roles in identities.DEFAULT_PRINCIPALS.items():
                await policy_repo.put_principal(conn, tenant_id, principal, roles)
        write = await self.crm.token(str(tenant_id), "write")
        lookup = await self.crm.token(str(tenant_id), "lookup")
        for conn in ("crm", "billing"):
            self.directory[(tenant_id, conn, customer)] = str(record["revision"])
            self.write_tokens[conn][str(tenant_id)] = write
            self.lookup_tokens[conn][str(tenant_id)] = lookup
        return Tenant(tenant_id, customer, write, lookup)

    def admitter(self) -> admission.Admitter:
        return admission.Admitter(pool=self.admission_pool, allowlist=RULES, resolver=MappingResolver(self.directory),
                                  authorizer=self.authorizer, cipher=keys.PayloadCipher(self.master))

    def dispatcher(self, worker: str = "w1", lease_s: float = 60.0) -> dispatcher.Dispatcher:
        return dispatcher.Dispatcher(
            pool=self.pool, connectors=self.connectors,
            credentials=base.Credentials("write", self.write_tokens),
            cipher=keys.PayloadCipher(self.master), authorizer=self.authorizer, allowlist=RULES,
            worker_id=worker, lease_s=lease_s)

    def reconciler(self, pool: asyncpg.Pool | None = None) -> reconciler.Reconciler:
        return reconciler.Reconciler(pool=pool or self.reconciler_pool, connectors=self.connectors,
                                     credentials=base.Credentials("lookup", self.lookup_tokens),
                                     worker_id="reconciler-1")

    async def admit(self, t: Tenant, action: str, arguments: dict[str, Any],
                    expected_revision: str | None = None) -> uuid.UUID:
        op = uuid.uuid4()
        proposal = ProposalV1.model_validate_json(json.dumps({
            "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
            "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
            "action": action, "arguments": {"customer_id": t.customer_id, **arguments},
            "target": t.customer_id, "expected_revision": expected_revision,
            "planner": {"name": "test"}, "created_at": datetime.now(UTC).isoformat()}))
        result = await self.admitter().admit(proposal)
        if result.status == "pending_approval":
            assert result.approval_id is not None
            await self.approve(t, result.approval_id, action)
            return op
        assert result.status == "admitted", result
        return op

    async def approve(self, t: Tenant, approval_id: uuid.UUID, action: str) -> None:
        """Approve through the real path: the approver's policy check, then admit that hash."""
        approver = "user:fiona" if action.startswith("billing.") else "user:bob"
        async with self.admission_pool.acquire() as conn:
            pending = await approvals.get(conn, t.tenant_id, approval_id)
            verdict = await self.authorizer.may_approve(
                conn, tenant_id=t.tenant_id, approver_id=approver,
                requester_id=pending.principal_id, action=RULES.get(action),
                resource_id=pending.resource_id)
            _, admitted = await approvals.decide(
                conn, t.tenant_id, approval_id, approver=approver, approve=True,
                shown_hash=pending.hash_hex, reason="looks right", approver_decision=verdict)
        assert admitted is not None and admitted.status == "admitted", verdict

    async def row(self, t: Tenant, op: uuid.UUID) -> asyncpg.Record:
        async with self.owner.acquire() as conn:
            row = await conn.fetchrow("SELECT * FROM agent_command WHERE tenant_id=$1 AND operation_id=$2",
                                      t.tenant_id, op)
        assert row is not None
        return row

    async def effects(self, t: Tenant, kind: str | None = None) -> list[dict[str, Any]]:
        effects = await self.crm.effects(str(t.tenant_id))
        return [e for e in effects if kind is None or e["kind"] == kind]


async def open_world(crm: Crm, database_url: str) -> World:
    async def pool(role: str | None, size: int) -> asyncpg.Pool:
        async def init(conn: asyncpg.Connection) -> None:
            if role:
                await conn.execute(f"SET ROLE {role}")
        return await asyncpg.create_pool(database_url, min_size=1, max_size=size, init=init)

    return World(crm, await pool("agentledger_executor", 10), await pool("agentledger_admission", 4),
                 await pool("agentledger_reconciler", 4), await pool(None, 4),
                 connectors=crm_connectors.registry(crm.url))


async def close_world(w: World) -> None:
    for p in (w.pool, w.admission_pool, w.reconciler_pool, w.owner):
        await p.close()
    for c in w.connectors.values():
        await c.aclose()


def fixtures(**crm_settings: str) -> tuple[Any, Any]:
    """A module's ``crm`` (one CRM process with fault rules, ``crm_settings`` as its settings)
    and ``world`` (a fresh world per test, fault rules disarmed after it) fixtures:
    ``crm, world = executor_world.fixtures()`` at a test module's top level."""

    @pytest.fixture(scope="module", name="crm")
    def crm_fixture(make_database: Callable[[], str],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crm]:
        with run_crm(make_database(), tmp_path_factory.mktemp("crm"), faults_enabled="true",
                     **crm_settings) as c:
            yield c

    @pytest.fixture(name="world")
    async def world_fixture(crm: Crm, database_url: str) -> AsyncIterator[World]:
        w = await open_world(crm, database_url)
        yield w
        await crm.disarm()
        await close_world(w)

    return crm_fixture, world_fixture
