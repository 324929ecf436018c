"""Group commit (issue 20 §2 and §3): units of work that overlap share one transaction, and one
unit's failure never costs another its work — on real PostgreSQL.

The ``txid_current()`` each unit sees tells which units shared a transaction.
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg
import pytest

from agentledger import errors
from agentledger.ledger import dispatch, groupcommit, repository
from tests.integration import executor_world
from tests.integration.executor_world import World

TENANT = uuid.uuid4()
NOTE = "crm.note.create"

crm, world = executor_world.fixtures()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    async with p.acquire() as conn:
        await conn.execute(
            "DROP TABLE IF EXISTS gc_probe; CREATE TABLE gc_probe ("
            " n int PRIMARY KEY CHECK (n >= 0), txid bigint NOT NULL,"
            " k int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    yield p
    await p.close()


def insert(n: int, k: int | None = None) -> Callable[[repository.Conn], Coroutine[Any, Any, int]]:
    """A unit: one row in its own (or its group's) transaction; returns that transaction."""
    async def unit(conn: repository.Conn) -> int:
        async with repository.transaction(conn, TENANT) as tx:
            txid: int = await tx.fetchval("SELECT txid_current()")
            await tx.execute("INSERT INTO gc_probe (n, txid, k) VALUES ($1, $2, $3)",
                             n, txid, k if k is not None else n)
        return txid
    return unit


async def committed(pool: asyncpg.Pool) -> dict[int, int]:
    async with pool.acquire() as conn:
        return {r["n"]: r["txid"] for r in await conn.fetch("SELECT n, txid FROM gc_probe")}


async def test_units_that_arrive_together_commit_in_one_transaction(pool: asyncpg.Pool) -> None:
    group = groupcommit.GroupCommit(pool, leaders=1)
    txids = await asyncio.gather(*(group.run(TENANT, insert(n)) for n in range(8)))
    assert len(set(txids)) == 1
    assert await committed(pool) == {n: txids[0] for n in range(8)}
    assert (group.stats.groups, group.stats.grouped_units, group.stats.fallbacks) == (1, 8, 0)


CALLER: contextvars.ContextVar[int] = contextvars.ContextVar("caller")


async def test_each_unit_runs_in_its_callers_context(pool: asyncpg.Pool) -> None:
    # A unit's spans must be children of its caller's span, not of whichever caller started
    # the group's leader task: the unit runs in its caller's context (here, a plain var).
    group = groupcommit.GroupCommit(pool, leaders=1)

    async def call(n: int) -> tuple[int, int, int]:
        CALLER.set(n)

        async def unit(conn: repository.Conn) -> tuple[int, int]:
            return CALLER.get(), await insert(n)(conn)
        seen, txid = await group.run(TENANT, unit)
        return n, seen, txid

    results = await asyncio.gather(*(call(n) for n in range(5)))
    assert [seen for _, seen, _ in results] == list(range(5))
    assert len({txid for _, _, txid in results}) == 1 and group.stats.groups == 1


async def test_a_trickle_runs_each_unit_alone_with_no_wait(pool: asyncpg.Pool) -> None:
    group = groupcommit.GroupCommit(pool, leaders=1)
    txids = [await group.run(TENANT, insert(n)) for n in range(3)]
    assert len(set(txids)) == 3
    assert (group.stats.groups, group.stats.alone) == (0, 3)


async def test_one_units_bad_data_fails_it_alone_and_the_others_commit(pool: asyncpg.Pool) -> None:
    group = groupcommit.GroupCommit(pool, leaders=1)
    units = [insert(n) for n in range(6)]
    units[3] = insert(-1)  # the CHECK refuses it: data, final (SQLSTATE 23514)
    results = await asyncio.gather(*(group.run(TENANT, u) for u in units), return_exceptions=True)
    assert isinstance(results[3], errors.DataRejected)
    rows = await committed(pool)
    assert sorted(rows) == [0, 1, 2, 4, 5]
    # The group rolled back and each unit ran alone, in its own transaction.
    assert len(set(rows.values())) == 5 and group.stats.fallbacks == 1
    assert group.stats.groups == 0


async def test_a_unit_that_catches_its_own_failure_still_cannot_commit_the_group(
    pool: asyncpg.Pool,
) -> None:
    # Without the rule, the group's transaction is left aborted by the caught error, its
    # COMMIT silently rolls back, and every other unit's caller is told it committed.
    async def catches(conn: repository.Conn) -> str:
        try:
            await insert(-1)(conn)
        except errors.DataRejected:
            return "caught"
        return "inserted"

    # Last in its group: no later unit trips over the aborted transaction.
    group = groupcommit.GroupCommit(pool, leaders=1)
    results = await asyncio.gather(group.run(TENANT, insert(1)), group.run(TENANT, insert(2)),
                                   group.run(TENANT, catches))
    assert results[2] == "caught"
    rows = await committed(pool)
    assert rows == {1: results[0], 2: results[1]} and results[0] != results[1]
    assert group.stats.fallbacks == 1


async def test_a_commit_the_server_refuses_falls_back_to_each_unit_alone(pool: asyncpg.Pool) -> None:
    # A deferred UNIQUE is checked at COMMIT: the server answers that COMMIT with 23505, so
    # nothing committed and the units can run again; the second of the pair loses alone.
    group = groupcommit.GroupCommit(pool, leaders=1)
    results = await asyncio.gather(group.run(TENANT, insert(1, k=7)), group.run(TENANT, insert(2)),
                                   group.run(TENANT, insert(3, k=7)), return_exceptions=True)
    assert isinstance(results[2], errors.DataRejected)
    assert sorted(await committed(pool)) == [1, 2]
    assert group.stats.fallbacks == 1


async def test_a_unit_binding_another_tenant_runs_alone(pool: asyncpg.Pool) -> None:
    other = uuid.uuid4()

    async def elsewhere(conn: repository.Conn) -> str:
        async with repository.transaction(conn, other) as tx:
            return str(await tx.fetchval("SELECT current_setting('agentledger.tenant_id')"))

    group = groupcommit.GroupCommit(pool, leaders=1)
    results = await asyncio.gather(group.run(TENANT, insert(1)), group.run(TENANT, elsewhere))
    assert results[1] == str(other) and group.stats.fallbacks == 1
    assert list(await committed(pool)) == [1]


async def test_two_groups_that_deadlock_end_with_every_unit_done(pool: asyncpg.Pool) -> None:
    # A group holds its units' row locks until its COMMIT. Two groups locking rows 1 and 2
    # in opposite orders deadlock; Postgres ends one (40P01), whose units then run alone.
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO gc_probe (n, txid) VALUES (1, 0), (2, 0)")
    first_locks: list[int] = []
    both_locked = asyncio.Event()

    def lock(row: int, *, first: bool) -> Callable[[repository.Conn], Coroutine[Any, Any, int]]:
        async def unit(conn: repository.Conn) -> int:
            async with repository.transaction(conn, TENANT) as tx:
                await tx.execute("SELECT 1 FROM gc_probe WHERE n = $1 FOR UPDATE", row)
                if first and not both_locked.is_set():
                    first_locks.append(row)  # each group holds its first row, then both go on
                    if len(first_locks) == 2:
                        both_locked.set()
                    await both_locked.wait()
                return int(await tx.fetchval("SELECT txid_current()"))
        return unit

    one, two = (groupcommit.GroupCommit(pool, leaders=1) for _ in range(2))
    txids = await asyncio.wait_for(asyncio.gather(
        one.run(TENANT, lock(1, first=True)), one.run(TENANT, lock(2, first=False)),
        two.run(TENANT, lock(2, first=True)), two.run(TENANT, lock(1, first=False))), 30)
    assert sorted(first_locks) == [1, 2]
    assert (one.stats.fallbacks + two.stats.fallbacks, one.stats.groups + two.stats.groups) == (1, 1)
    # The group that committed shares one transaction; the other's units each had their own.
    assert len(set(txids)) == 3


async def test_claims_of_records_that_arrive_together_share_one_commit(world: World) -> None:
    """The executor's claims in one statement (issue 41: ledger.steps, coalesced): each still
    gets its own claim, attempt, audit event and dispatch-time decision; a missing and a held
    command in the same statement answer as they would alone; the calls and finalizes that
    follow record each outcome."""
    t = await world.tenant()
    ops = [await world.admit(t, NOTE, {"body": f"note {i}"}) for i in range(6)]
    first = world.dispatcher(worker="w0")
    taken = await first.begin(t.tenant_id, ops[0])  # held by another worker's live claim
    assert taken.claim is not None
    worker = world.dispatcher(worker="w1")
    missing = uuid.uuid4()
    begun = await asyncio.gather(*(worker.begin(t.tenant_id, op) for op in [*ops, missing]))
    assert [b.disposition for b in begun] == ["held", *["claimed"] * 5, "missing"]
    # The seven claims asked together: one statement carried them all.
    assert (worker._claims.stats.statements, worker._claims.stats.rows) == (1, 7)

    states = await asyncio.gather(*(worker.complete(b.claim) for b in begun[1:6] if b.claim))
    assert states == ["succeeded"] * 5
    notes = await world.effects(t, "note.created")
    assert sorted(n["idempotency_key"] for n in notes) == sorted(str(op) for op in ops[1:])
    async with world.owner.acquire() as conn:
        for op in ops[1:]:
            attempts = await dispatch.attempts(conn, t.tenant_id, op)
            assert [(a["worker_id"], a["kind"], a["result"]) for a in attempts] == [
                ("w1", "dispatch", "succeeded")]
            events = await conn.fetch(
                "SELECT type FROM audit_event WHERE tenant_id=$1 AND operation_id=$2", t.tenant_id, op)
            assert {"command.claimed", "command.succeeded"} <= {e["type"] for e in events}
            decisions = await conn.fetchval(
                "SELECT count(*) FROM policy_decision WHERE tenant_id=$1 AND operation_id=$2"
                " AND stage='dispatch'", t.tenant_id, op)
            assert decisions == 1
        assert (await world.row(t, ops[0]))["state"] == "dispatching"


async def test_a_unit_alone_that_loses_a_deadlock_runs_again_bounded(pool: asyncpg.Pool) -> None:
    # Issue 42: a unit alone can lose a deadlock to a group of its tenant (budget windows
    # locked in its units' order); its transaction rolled back whole, so it runs again — up
    # to ALONE_ATTEMPTS times, and never for another error.
    group = groupcommit.GroupCommit(pool, leaders=1, max_group=1)
    runs: list[int] = []

    def unit(fail_first: int, sqlstate: str) -> Callable[[repository.Conn], Coroutine[Any, Any, int]]:
        async def run(conn: repository.Conn) -> int:
            runs.append(1)
            if len(runs) <= fail_first:
                raise errors.StorageError("deadlock detected", sqlstate=sqlstate)
            return int(await conn.fetchval("SELECT 1"))
        return run

    assert await group.run(uuid.uuid4(), unit(2, "40P01")) == 1
    assert len(runs) == 3
    runs.clear()
    with pytest.raises(errors.StorageError):
        await group.run(uuid.uuid4(), unit(groupcommit.ALONE_ATTEMPTS, "40P01"))
    assert len(runs) == groupcommit.ALONE_ATTEMPTS
    runs.clear()
    with pytest.raises(errors.StorageError):  # not a transient failure: raised at once
        await group.run(uuid.uuid4(), unit(1, "08006"))
    assert len(runs) == 1
