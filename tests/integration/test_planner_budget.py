"""The planner reserves model tokens before each model call, with a function-only database
role, from limits it cannot choose (R7.1-R7.3)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from agentledger.contracts import proposals
from agentledger.planning import adapters, budget
from tests.unit.test_planner_proposer import TENANT, FixedAdapter, envelope_for, make, request

PLAN = adapters.Plan("crm.note.create", {"customer_id": "cust-a", "body": "hi"}, "cust-a",
                     usage=proposals.TokenUsage(prompt_tokens=1200, completion_tokens=300))


class CountingAdapter(FixedAdapter):
    def __init__(self, plan: adapters.Plan) -> None:
        super().__init__(plan)
        self.calls = 0

    async def plan(self, task: adapters.Task) -> adapters.Plan | adapters.Refusal:
        self.calls += 1
        return self.result


@pytest.fixture
async def planner_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    owner = await asyncpg.connect(database_url)  # an operator sets the tenant's default
    await owner.execute("INSERT INTO budget_default (tenant_id, kind, limit_amount) "
                        "VALUES ($1, 'model_tokens', 5000) ON CONFLICT DO NOTHING", TENANT)
    await owner.close()

    async def init(conn: asyncpg.Connection) -> None:
        await conn.execute("SET ROLE agentledger_planner")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2, init=init)
    yield pool
    await pool.close()


async def test_tokens_are_reserved_before_each_call_and_exhaustion_stops_the_model(
    planner_pool: asyncpg.Pool, database_url: str
) -> None:
    model = CountingAdapter(PLAN)
    planner = dataclasses.replace(make(adapter=model),
                                  tokens=budget.TokenBudget(planner_pool, per_call=4000))
    first = request()
    # One workflow (request id): the same envelope request id for the follow-up step.
    assert isinstance(await planner.propose(first), proposals.ProposalV1)
    op = uuid.uuid4()
    envelope = envelope_for(operation_id=op, request_id=first.request_id)
    second = request(request_id=first.request_id, operation_id=op, identity=envelope)
    again = await planner.propose(second)
    # 5000 - 1500 used leaves 3500 < 4000 needed: refused, and the model was never asked.
    assert isinstance(again, adapters.Refusal) and again.code == "budget_exhausted"
    assert model.calls == 1
    owner = await asyncpg.connect(database_url)
    try:
        row = await owner.fetchrow("SELECT limit_amount, reserved, used FROM budget "
                                   "WHERE tenant_id = $1 AND kind = 'model_tokens'", TENANT)
        audited = await owner.fetchval("SELECT count(*) FROM audit_event WHERE tenant_id = $1 "
                                       "AND type = 'budget.exhausted'", TENANT)
    finally:
        await owner.close()
    assert (row["limit_amount"], row["reserved"], row["used"]) == (5000, 0, 1500)
    assert audited == 1


async def test_the_planner_role_can_read_or_write_no_table(planner_pool: asyncpg.Pool) -> None:
    async with planner_pool.acquire() as conn:
        for statement in ("SELECT 1 FROM budget LIMIT 1", "SELECT 1 FROM budget_default LIMIT 1",
                          "SELECT 1 FROM agent_command LIMIT 1",
                          f"INSERT INTO budget (tenant_id, workflow_id, kind, limit_amount) "
                          f"VALUES ('{uuid.uuid4()}', 'w', 'model_tokens', 10)"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)


async def test_a_tenant_without_a_default_gets_no_model_call(planner_pool: asyncpg.Pool) -> None:
    model = CountingAdapter(PLAN)
    planner = dataclasses.replace(make(adapter=model),
                                  tokens=budget.TokenBudget(planner_pool, per_call=10))
    tenant, op, request_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    envelope = envelope_for(tenant_id=tenant, operation_id=op, request_id=request_id)
    other = request(tenant_id=tenant, operation_id=op, request_id=request_id, identity=envelope)
    result = await planner.propose(other)
    assert isinstance(result, adapters.Refusal) and model.calls == 0
