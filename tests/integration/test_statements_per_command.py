"""What one command asks of the ledger on the happy path (issue 41): every statement the
admission, the claim, the pre-call mark and the finalize send, counted on the connections
that send them. A regression to the per-row statements of 85a9f05 (8 + 3 + 2 + 1) fails
here; the cost of a statement is measured by `make bench`, never asserted in a test."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from agentledger import admission
from agentledger.budgets import rules as budget_rules
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import keys, repository
from tests.integration import executor_world
from tests.integration.executor_world import RULES, World

crm, world = executor_world.fixtures()


class Counted:
    """A pool as one role whose connections log every statement they send."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def log(self, record: asyncpg.connection.LoggedQuery) -> None:
        self.sent.append(" ".join(record.query.split())[:80])

    async def pool(self, url: str, role: str) -> asyncpg.Pool:
        async def init(conn: asyncpg.Connection) -> None:
            await conn.execute(f"SET ROLE {role}")
            conn.add_query_logger(self.log)
        # As the services pool: no reset round trip on release (repository.keep_session).
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1, init=init,
                                         reset=repository.keep_session)
        assert pool is not None
        self.sent.clear()  # the SET ROLE of init
        return pool

    def statements(self) -> list[str]:
        """What was sent, less the transaction's own BEGIN (with its settings) and COMMIT, and
        asyncpg's one-time introspection of a type a connection meets first (the arrays of the
        set-based statements): once per connection and type, not per command."""
        return [q for q in self.sent if not q.startswith(
            ("BEGIN", "COMMIT", "WITH RECURSIVE typeinfo_tree", "SELECT current_setting('jit')",
             "SELECT set_config('jit'", "RESET jit"))]


@pytest.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[Counted, asyncpg.Pool, Counted,
                                                             asyncpg.Pool]]:
    a, e = Counted(), Counted()
    admission_pool = await a.pool(database_url, "agentledger_admission")
    executor_pool = await e.pool(database_url, "agentledger_executor")
    yield a, admission_pool, e, executor_pool
    await admission_pool.close()
    await executor_pool.close()


async def test_a_note_costs_two_admission_statements_and_three_executor_statements(
    world: World, counted: tuple[Counted, asyncpg.Pool, Counted, asyncpg.Pool],
) -> None:
    a, admission_pool, e, executor_pool = counted
    t = await world.tenant()
    cipher = keys.PayloadCipher(world.master)
    admitter = admission.Admitter(pool=admission_pool, allowlist=RULES,
                                  resolver=world.admitter().resolver,
                                  authorizer=world.authorizer, cipher=cipher,
                                  budget_limits={"tool_calls": 5})
    async with admission_pool.acquire() as conn:
        await cipher.warm(conn, t.tenant_id)  # once per tenant and process, not per command
    op = uuid.uuid4()
    proposal = ProposalV1.model_validate_json(json.dumps({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": "crm.note.create", "arguments": {"customer_id": t.customer_id,
                                                   "body": "counted"},
        "target": t.customer_id, "planner": {"name": "test"},
        "created_at": datetime.now(UTC).isoformat()}))
    a.sent.clear()
    result = await admitter.admit(proposal)
    assert result.status == "admitted", result
    # The principal's read (it must precede Cedar), then the one statement that admits.
    assert len(a.statements()) == 2, a.statements()

    worker = world.dispatcher()
    worker.pool = executor_pool
    worker.__post_init__()  # its group commit over the counted pool
    async with executor_pool.acquire() as conn:
        await worker.cipher.warm(conn, t.tenant_id)  # once per tenant and process
    e.sent.clear()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    claim = e.statements()
    e.sent.clear()
    assert await worker.complete(begun.claim) == "succeeded"
    # The claim with its command and principal; the pre-call mark with the dispatch-time
    # decision; the finalize with its events. The payload's data key was cached above.
    assert (len(claim), len(e.statements())) == (1, 2), (claim, e.statements())
    row = await world.row(t, op)
    assert row["state"] == "succeeded"
    async with world.owner.acquire() as conn:
        decided = await conn.fetch("SELECT stage FROM policy_decision WHERE operation_id = $1 "
                                   "ORDER BY decided_at", op)
        spent = await conn.fetchrow("SELECT used, reserved FROM budget WHERE tenant_id = $1",
                                    t.tenant_id)
        audited = await conn.fetch("SELECT type FROM audit_event WHERE operation_id = $1 "
                                   "ORDER BY seq", op)
    assert [d["stage"] for d in decided] == ["admission", "dispatch"]
    assert spent is None  # no workflow: unbudgeted (the envelope names the workflow)
    assert [r["type"] for r in audited] == ["command.admitted", "command.claimed",
                                            "command.succeeded"]


async def test_the_operators_budgets_add_no_admission_statement(
    world: World, counted: tuple[Counted, asyncpg.Pool, Counted, asyncpg.Pool],
) -> None:
    # Issue 42: a principal's and a tenant's budgets are charged inside the one admitting
    # statement (agentledger_budget_charge_v1), not beside it.
    a, admission_pool, _, _ = counted
    t = await world.tenant()
    cipher = keys.PayloadCipher(world.master)
    found = budget_rules.Budgets.parse({"format": budget_rules.FILE_FORMAT, "budgets": [
        {"name": "notes-per-principal-day", "scope": "principal", "window": "day",
         "unit": "calls", "limit": 10},
        {"name": "notes-per-tenant-hour", "scope": "tenant", "window": "hour", "unit": "calls",
         "limit": 100}]})
    admitter = admission.Admitter(pool=admission_pool, allowlist=RULES,
                                  resolver=world.admitter().resolver,
                                  authorizer=world.authorizer, cipher=cipher,
                                  budget_limits={"tool_calls": 5}, budget_rules=found)
    async with admission_pool.acquire() as conn:
        await cipher.warm(conn, t.tenant_id)
    op = uuid.uuid4()
    proposal = ProposalV1.model_validate_json(json.dumps({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": "crm.note.create", "arguments": {"customer_id": t.customer_id,
                                                   "body": "counted, budgeted"},
        "target": t.customer_id, "planner": {"name": "test"},
        "created_at": datetime.now(UTC).isoformat()}))
    a.sent.clear()
    result = await admitter.admit(proposal)
    assert result.status == "admitted", result
    assert len(a.statements()) == 2, a.statements()
    async with world.owner.acquire() as conn:
        charged = await conn.fetch("SELECT budget, state FROM budget_charge WHERE "
                                   "operation_id = $1 ORDER BY budget", op)
    assert [(c["budget"], c["state"]) for c in charged] == [
        ("notes-per-principal-day", "reserved"), ("notes-per-tenant-hour", "reserved")]
