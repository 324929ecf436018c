"""The SQL functions of the hot path as the planner sees them (issue 41, migration 0054).

A LANGUAGE sql function the planner cannot inline is parsed and planned again on every
execution of the statement that calls it; a few rows per statement then pay a planning each.
These tests read the plans of the statements that call our functions once per command (the
audit copy's leaf hash, the relay's and the executor's visibility check) and fail when a
LANGUAGE sql function is left in one. They also check that the visibility check, now written
to inline, gives the answers of migration 0018's, across xid epochs."""

from __future__ import annotations

import re

import asyncpg
import pytest

from agentledger.ledger.repository import Q
from agentledger.relay import repository as relay_repository

# As the copy trigger (agentledger_copy_audit_events_v3) calls it, over rows, never constants
# (an IMMUTABLE call on constants is folded at plan time and would prove nothing).
LEAF_HASH = ("SELECT public.agentledger_audit_leaf_hash(n.event_id, n.tenant_id, n.operation_id,"
             " n.type, n.payload, n.traceparent, n.recorded_at) FROM public.audit_event AS n")
RELAY_INVISIBLE = relay_repository._PREPARE_INVISIBLE.split(" AS ", 1)[1]


async def _sql_functions_in_plan(db: asyncpg.Connection, statement: str, *types: str) -> set[str]:
    name = "probe_plan"
    await db.execute(f"PREPARE {name}({', '.join(types)}) AS {statement}" if types
                     else f"PREPARE {name} AS {statement}")
    try:
        await db.execute("SET plan_cache_mode = force_generic_plan")
        args = ", ".join("NULL" for _ in types)
        lines = await db.fetch(f"EXPLAIN (VERBOSE) EXECUTE {name}" + (f"({args})" if types else ""))
    finally:
        await db.execute(f"DEALLOCATE {name}")
        await db.execute("RESET plan_cache_mode")
    plan = "\n".join(line[0] for line in lines)
    called = set(re.findall(r"\b(?:public\.)?(agentledger_\w+)\(", plan))
    assert called or "pg_visible_in_snapshot" in plan or "sha256" in plan, plan
    rows = await db.fetch(
        "SELECT p.proname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "WHERE l.lanname = 'sql' AND p.proname = ANY($1::text[])", sorted(called))
    return {row["proname"] for row in rows}


@pytest.mark.parametrize(("statement", "types"), [
    pytest.param(LEAF_HASH, (), id="audit-copy-leaf-hash"),
    pytest.param(RELAY_INVISIBLE, ("bigint[]",), id="relay-read-pass"),
    pytest.param(Q["xid_visible"].replace("$1", "$1::bigint"), ("bigint",), id="executor"),
])
async def test_no_sql_function_is_planned_per_statement(
        db: asyncpg.Connection, statement: str, types: tuple[str, ...]) -> None:
    assert await _sql_functions_in_plan(db, statement, *types) == set()


def _visible_0018(xid32: int, xmin: int, xmax: int, xip: set[int]) -> bool:
    """Migration 0018's answer, in Python: the 64-bit xid from xmax's epoch (the epoch before
    when that would be at or past xmax), then pg_visible_in_snapshot's rule."""
    epoch = xmax >> 32
    full = (epoch << 32) + xid32
    if full >= xmax and epoch > 0:
        full = ((epoch - 1) << 32) + xid32
    if full < xmin:
        return True
    return full < xmax and full not in xip


async def test_the_visibility_check_places_a_32_bit_xid_in_the_snapshots_epoch(
        db: asyncpg.Connection) -> None:
    cases = 0
    for epoch in (0, 1, 7):
        base = epoch << 32
        for xmin32, xmax32 in ((1_000, 1_010), (4_294_967_000, 4_294_967_290), (5, 5)):
            xmin, xmax = base + xmin32, base + xmax32
            xip = {xmin + 2, xmin + 5} if xmax - xmin > 5 else set()
            snapshot = f"{xmin}:{xmax}:{','.join(str(x) for x in sorted(xip))}"
            xids = {0, 3, xmin32 - 1, xmin32, xmin32 + 2, xmin32 + 3, xmin32 + 5, xmax32 - 1,
                    xmax32, xmax32 + 1, 2**31, 2**32 - 1}
            for xid32 in sorted(x for x in xids if 0 <= x < 2**32):
                got = await db.fetchval("SELECT agentledger_xid_visible_in($1, $2::text::pg_snapshot)",
                                        xid32, snapshot)
                assert got is _visible_0018(xid32, xmin, xmax, xip), (snapshot, xid32)
                cases += 1
    assert cases > 100


async def test_a_transaction_is_invisible_until_it_commits(database_url: str) -> None:
    writer, reader = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        tx = writer.transaction()
        await tx.start()
        xid32 = int(await writer.fetchval("SELECT txid_current()")) % 2**32
        assert await reader.fetchval(Q["xid_visible"], xid32) is False
        invisible = await reader.fetch(RELAY_INVISIBLE.replace("$1", "$1::bigint[]"), [xid32])
        assert [row[0] for row in invisible] == [xid32]
        await tx.commit()
        assert await reader.fetchval(Q["xid_visible"], xid32) is True
        assert await reader.fetch(RELAY_INVISIBLE.replace("$1", "$1::bigint[]"), [xid32]) == []
    finally:
        await writer.close()
        await reader.close()
