"""Budgets (R7): atomic reservations under concurrency, deadlines, settlement, audit, roles."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentledger import budgets, errors
from agentledger.ledger import repository
from tests.integration.conftest import AsRole


async def _exhaustion_audits(db: asyncpg.Connection, tenant: uuid.UUID) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT payload, operation_id FROM event_outbox "
        "WHERE tenant_id = $1 AND aggregatetype = 'audit' AND type = 'budget.exhausted' "
        "ORDER BY created_at", tenant)


async def _open(db: asyncpg.Connection, tenant: uuid.UUID, **limits: int) -> str:
    workflow = f"wf-{uuid.uuid4().hex[:8]}"
    await budgets.open(db, tenant, workflow, limits, None)  # type: ignore[arg-type]
    return workflow


@pytest.mark.parametrize("role", ["agentledger_admission", "agentledger_planner"])
async def test_50_parallel_reservations_against_10_tool_calls_admit_exactly_10(
    db: asyncpg.Connection, as_role: AsRole, role: str
) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=10)
    conns = await asyncio.gather(*(as_role(role) for _ in range(50)))
    start = asyncio.Event()

    async def step(
        conn: asyncpg.Connection,
    ) -> tuple[uuid.UUID, budgets.Reservation | errors.BudgetExhausted]:
        op = uuid.uuid4()
        await start.wait()
        try:
            return op, await budgets.reserve(conn, tenant, workflow, "tool_calls", 1,
                                             operation_id=op)
        except errors.BudgetExhausted as exc:
            return op, exc

    tasks = [asyncio.create_task(step(c)) for c in conns]
    start.set()
    outcomes = dict(await asyncio.gather(*tasks))
    results = list(outcomes.values())

    won = [r for r in results if isinstance(r, budgets.Reservation)]
    refused = [r for r in results if isinstance(r, errors.BudgetExhausted)]
    assert (len(won), len(refused)) == (10, 40)
    assert len({r.reservation_id for r in won}) == 10
    assert all(e.details["reason"] == "exhausted" and e.details["kind"] == "tool_calls"
               and e.details["workflow_id"] == workflow and e.details["remaining"] == 0
               and e.code == "budget_exhausted" and not e.retryable for e in refused)
    balance = (await budgets.remaining(db, tenant, workflow))["tool_calls"]
    assert (balance.limit, balance.reserved, balance.used, balance.remaining) == (10, 10, 0, 0)

    # Every refusal is audited, with the operation it refused.
    audits = await _exhaustion_audits(db, tenant)
    assert {a["operation_id"] for a in audits} == {
        op for op, r in outcomes.items() if isinstance(r, errors.BudgetExhausted)}
    assert len(audits) == 40


async def test_remaining_can_never_go_negative(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=2)
    # Even the owner, bypassing the functions, cannot overdraw: the CHECK holds.
    with pytest.raises(asyncpg.CheckViolationError, match="budget_remaining_not_negative"):
        await db.execute("UPDATE budget SET reserved = 3 WHERE tenant_id = $1", tenant)
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("UPDATE budget SET used = -1 WHERE tenant_id = $1", tenant)
    with pytest.raises(errors.BudgetExhausted):
        await budgets.reserve(db, tenant, workflow, "tool_calls", 3)


async def test_a_passed_deadline_exhausts_every_kind(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    workflow = "wf-deadline"
    deadline = datetime.now(UTC) + timedelta(hours=1)
    await budgets.open(db, tenant, workflow, {"tool_calls": 100, "model_tokens": 10_000}, deadline)
    await budgets.reserve(db, tenant, workflow, "model_tokens", 500)
    # The clock moving past the deadline, in one statement (no race with a 1 s deadline).
    await db.execute("UPDATE budget SET deadline = now() - interval '1 second' "
                     "WHERE tenant_id = $1 AND workflow_id = $2", tenant, workflow)

    with pytest.raises(errors.BudgetExhausted) as refused:
        await budgets.reserve(db, tenant, workflow, "tool_calls", 1)
    assert refused.value.details["reason"] == "deadline_passed"
    with pytest.raises(errors.BudgetExhausted, match="deadline passed"):
        await budgets.reserve(db, tenant, workflow, "model_tokens", 1)
    audits = await _exhaustion_audits(db, tenant)
    assert audits and audits[-1]["payload"].count("deadline_passed") == 1


async def test_release_returns_the_reservation(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=1)
    held = await budgets.reserve(db, tenant, workflow, "tool_calls", 1)
    with pytest.raises(errors.BudgetExhausted):
        await budgets.reserve(db, tenant, workflow, "tool_calls", 1)
    released = await budgets.release(db, held)
    assert (released.state, released.used_amount) == ("released", 0)
    again = await budgets.reserve(db, tenant, workflow, "tool_calls", 1)
    assert again.reservation_id != held.reservation_id


async def test_settling_is_idempotent_even_when_concurrent(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, model_tokens=1000)
    held = await budgets.reserve(db, tenant, workflow, "model_tokens", 400)
    conns = await asyncio.gather(*(as_role("agentledger_planner") for _ in range(8)))
    settled = await asyncio.gather(*(budgets.commit(c, held, 150) for c in conns))
    assert {(s.state, s.used_amount) for s in settled} == {("committed", 150)}
    # A late release or a different commit changes nothing: the first settlement stands.
    assert (await budgets.release(db, held)).state == "committed"
    assert (await budgets.commit(db, held, 400)).used_amount == 150
    b = (await budgets.remaining(db, tenant, workflow))["model_tokens"]
    assert (b.reserved, b.used, b.remaining) == (0, 150, 850)


async def test_commit_is_bounded_by_the_reservation(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, model_tokens=100)
    held = await budgets.reserve(db, tenant, workflow, "model_tokens", 10)
    for bad in (11, -1):
        with pytest.raises(errors.ValidationFailed):
            await budgets.commit(db, held, bad)
    unknown = budgets.Reservation(uuid.uuid4(), tenant, workflow, "model_tokens", 10, "reserved")
    with pytest.raises(errors.ValidationFailed, match="no such budget reservation"):
        await budgets.release(db, unknown)
    with pytest.raises(errors.ValidationFailed):
        await budgets.reserve(db, tenant, workflow, "model_tokens", 0)
    with pytest.raises(errors.ValidationFailed):
        await budgets.reserve(db, tenant, workflow, "wall_clock", 1)  # type: ignore[arg-type]


async def test_a_concurrency_slot_returns_when_the_step_ends(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, concurrent_steps=2)
    a = await budgets.reserve(db, tenant, workflow, "concurrent_steps", 1)
    b = await budgets.reserve(db, tenant, workflow, "concurrent_steps", 1)
    with pytest.raises(errors.BudgetExhausted):
        await budgets.reserve(db, tenant, workflow, "concurrent_steps", 1)
    assert (await budgets.commit(db, a, 1)).used_amount == 0
    await budgets.release(db, b)
    slots = (await budgets.remaining(db, tenant, workflow))["concurrent_steps"]
    assert (slots.reserved, slots.used, slots.remaining) == (0, 0, 2)


async def test_opening_again_never_raises_a_limit(db: asyncpg.Connection) -> None:
    tenant = uuid.uuid4()
    first = await budgets.open(db, tenant, "wf", {"tool_calls": 3}, None)
    again = await budgets.open(db, tenant, "wf", {"tool_calls": 300, "model_tokens": 5}, None)
    assert first["tool_calls"].limit == again["tool_calls"].limit == 3
    assert again["model_tokens"].limit == 5


async def test_no_budget_is_refused_and_audited(db: asyncpg.Connection) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(errors.BudgetExhausted) as caught:
        await budgets.reserve(db, tenant, "never-opened", "tool_calls", 1, operation_id=op)
    assert caught.value.details["reason"] == "no_budget"
    [audit] = await _exhaustion_audits(db, tenant)
    assert audit["operation_id"] == op


async def test_reservations_are_found_by_operation(db: asyncpg.Connection) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=5)
    held = await budgets.reserve(db, tenant, workflow, "tool_calls", 1, operation_id=op)
    assert await budgets.reservations_for(db, tenant, op) == [held]
    await budgets.commit(db, held, 1)
    [done] = await budgets.reservations_for(db, tenant, op)
    assert (done.state, done.used_amount) == ("committed", 1)


async def test_budgets_are_isolated_per_tenant(db: asyncpg.Connection, as_role: AsRole) -> None:
    tenant, other = uuid.uuid4(), uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=5)
    held = await budgets.reserve(db, tenant, workflow, "tool_calls", 1)
    admission = await as_role("agentledger_admission")
    assert await budgets.remaining(admission, other, workflow) == {}
    with pytest.raises(errors.BudgetExhausted, match="no budget"):
        await budgets.reserve(admission, other, workflow, "tool_calls", 1)
    # Settling another tenant's reservation, even knowing its id, finds nothing.
    stolen = budgets.Reservation(held.reservation_id, other, workflow, "tool_calls", 1, "reserved")
    with pytest.raises(errors.ValidationFailed):
        await budgets.release(admission, stolen)
    assert (await budgets.remaining(db, tenant, workflow))["tool_calls"].reserved == 1


# ------------------------------------------------------------------------ the planner role

async def test_the_planner_reserves_and_settles_but_touches_no_table(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, model_tokens=1000)
    planner = await as_role("agentledger_planner")

    held = await budgets.reserve(planner, tenant, workflow, "model_tokens", 300)
    assert (await budgets.commit(planner, held, 120)).state == "committed"

    tables: dict[str, str] = {r["table_name"]: r["column"] for r in await db.fetch(
        "SELECT table_name, min(column_name) AS column FROM information_schema.columns "
        "WHERE table_schema = 'public' GROUP BY table_name")}
    assert {"budget", "budget_reservation", "event_outbox", "agent_command"} <= set(tables)
    for table, column in tables.items():
        for statement in (f"SELECT 1 FROM {table} LIMIT 1",
                          f"INSERT INTO {table} DEFAULT VALUES",
                          f"UPDATE {table} SET {column} = {column}",
                          f"DELETE FROM {table}"):
            with pytest.raises(errors.AccessDenied):
                async with repository.transaction(planner, tenant) as tx:
                    await tx.execute(statement)
    # Reading balances or opening budgets is not among its rights either.
    with pytest.raises(errors.AccessDenied):
        await budgets.remaining(planner, tenant, workflow)
    with pytest.raises(errors.AccessDenied):
        await budgets.open(planner, tenant, "wf-own", {"model_tokens": 10**9}, None)
    b = (await budgets.remaining(db, tenant, workflow))["model_tokens"]
    assert (b.reserved, b.used) == (0, 120)


async def test_the_functions_check_the_tenant_inside(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant = uuid.uuid4()
    workflow = await _open(db, tenant, tool_calls=5)
    planner = await as_role("agentledger_planner")
    # Bound to another tenant (or to none), naming this tenant in the arguments is refused.
    for bound in (uuid.uuid4(), None):
        with pytest.raises(errors.AccessDenied, match="tenant"):
            async with repository.transaction(planner, bound) as tx:
                await tx.fetch("SELECT * FROM agentledger_budget_reserve_v2($1, $2, 'tool_calls', 1)",
                               tenant, workflow)
        with pytest.raises(errors.AccessDenied, match="tenant"):
            async with repository.transaction(planner, bound) as tx:
                await tx.fetch("SELECT * FROM agentledger_budget_settle($1, $2, NULL)",
                               tenant, uuid.uuid4())
    assert (await budgets.remaining(db, tenant, workflow))["tool_calls"].reserved == 0


async def test_budget_roles_are_least_privilege(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        "SELECT rolname, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolcanlogin "
        "FROM pg_roles WHERE rolname IN ('agentledger_planner', 'agentledger_budget_keeper')")
    assert len(rows) == 2
    assert not any(r["rolsuper"] or r["rolbypassrls"] or r["rolcreaterole"] or r["rolcreatedb"]
                   or r["rolcanlogin"] for r in rows), rows
    functions = await db.fetch(
        "SELECT p.proname, pg_get_userbyid(p.proowner) AS owner, p.prosecdef, p.proconfig, "
        "       has_function_privilege('public', p.oid, 'EXECUTE') AS public_exec "
        "FROM pg_proc p WHERE p.proname LIKE 'agentledger_budget_%' "
        "AND pg_get_userbyid(p.proowner) <> 'agentledger_budget_counter'")  # 0040's: apart
    # Opening from the tenant's default (migration 0008): the planner never chooses a limit.
    assert {f["proname"] for f in functions} == {"agentledger_budget_reserve_v2",
                                                 "agentledger_budget_settle",
                                                 "agentledger_budget_open_default"}
    for f in functions:
        assert f["owner"] == "agentledger_budget_keeper" and f["prosecdef"], f
        assert f["proconfig"] == ["search_path=pg_catalog, public, pg_temp"], f
        assert not f["public_exec"], f
    forced = await db.fetch(
        "SELECT relname FROM pg_class WHERE relname IN ('budget', 'budget_reservation') "
        "AND relrowsecurity AND relforcerowsecurity")
    assert len(forced) == 2


async def test_a_reservation_is_idempotent_per_operation(db: asyncpg.Connection) -> None:
    # A proposal redelivered after its admission died between reserve and admit must not
    # spend the budget again (found by the chaos suite).
    tenant, workflow, op = uuid.uuid4(), "wf-redelivered", uuid.uuid4()
    await budgets.open(db, tenant, workflow, {"tool_calls": 2}, None)
    first = await budgets.reserve(db, tenant, workflow, "tool_calls", 1, operation_id=op)
    again = await budgets.reserve(db, tenant, workflow, "tool_calls", 1, operation_id=op)
    assert again.reservation_id == first.reservation_id
    left = await budgets.remaining(db, tenant, workflow)
    assert (left["tool_calls"].reserved, left["tool_calls"].remaining) == (1, 1)
    await budgets.commit(db, first, 1)
    # Once settled, the same operation reserves anew (a replay is released after admission).
    third = await budgets.reserve(db, tenant, workflow, "tool_calls", 1, operation_id=op)
    assert third.reservation_id != first.reservation_id
