"""A ledger transaction's COMMIT waiting for a synchronous standby is never cancelled by the
transaction's own timeout (issue 19).

Found by the standby chaos case: with the standby away for longer than the 5 s transaction
timeout, admission's commit was cancelled out of its wait — and a cancelled wait does not
undo a commit, it makes it visible on the primary alone. The command was then visible (the
relay would publish it, an executor would run it) while the standby had never received it:
a failover would lose an admitted, possibly executed command. The writer saw a retryable
error for a transaction that had in fact committed.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from agentledger.ledger import repository
from tests import syncrep
from tests.helpers import assert_eventually

# The transaction's bound; the commit is shown to wait for three times as long.
TIMEOUT_S = 0.5


async def test_a_commit_waiting_for_the_standby_outlives_the_transaction_timeout(database_url: str) -> None:
    table = f"syncrep_{uuid.uuid4().hex[:10]}"
    writer = await asyncpg.connect(database_url)
    observer = await asyncpg.connect(database_url)
    await writer.execute(f"CREATE TABLE {table} (x int)")
    writing: asyncio.Task[None] | None = None
    try:
        # Only sessions that ask for synchronous commit wait for the (absent) standby.
        with syncrep.ghost_standby(database_url):
            await writer.execute("SET synchronous_commit = on")

            async def write() -> None:
                async with repository.transaction(writer, None, timeout=TIMEOUT_S) as tx:
                    await tx.execute(f"INSERT INTO {table} VALUES (1)")
            writing = asyncio.create_task(write())

            async def parked_past_the_bound() -> bool:
                # Measured by the server: how long this COMMIT has waited for the standby.
                return bool(await observer.fetchval(
                    "SELECT clock_timestamp() - query_start > make_interval(secs => $2) "
                    "FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'",
                    writer.get_server_pid(), 3 * TIMEOUT_S))
            await assert_eventually(parked_past_the_bound, timeout=30,
                                    message="the commit did not keep waiting for the standby")
            # Still waiting, invisible, and the writer was told nothing.
            assert not writing.done()
            assert await observer.fetchval(f"SELECT count(*) FROM {table}") == 0
        # No synchronous standby any more: the parked commit completes, and the writer
        # returns normally.
        await asyncio.wait_for(writing, timeout=30)
        assert await observer.fetchval(f"SELECT count(*) FROM {table}") == 1
    finally:
        if writing is not None and not writing.done():
            writing.cancel()
        syncrep.release(database_url)
        await observer.execute(f"DROP TABLE IF EXISTS {table}")
        await observer.close()
        await writer.close(timeout=10)
