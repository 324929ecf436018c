"""The notary: sequences each tenant's audit leaves into its log and signs checkpoints.

It is the only writer of ``audit_log`` and ``audit_checkpoint`` and holds the signing key;
admission and the executors never wait for it (their statements only compute each row's
leaf hash). One notary sequences at a time (a transaction advisory lock); a second one is a
standby that finds the lock taken.

Which rows are safe to sequence: ``seq`` is drawn before a writer commits, so a row with a
lower ``seq`` can become visible after a higher one. Position order must be ``seq`` order
(``verify-chain`` relies on it), so the notary only sequences up to a *watermark*: the
newest ``seq`` a past cycle saw, once every transaction that was running then has ended
(this snapshot's ``xmin`` is at or past that cycle's ``xmax``). Every audit row is written by
a transaction that already holds an xid (the copy trigger runs after its outbox insert), so
no row at or below the watermark can still appear.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from uuid import UUID

import asyncpg

from agentledger import sql
from agentledger.evidence import checkpoint, keys, merkle

Q = sql.load(Path(__file__).with_name("queries.sql"))
log = logging.getLogger(__name__)

_LOCK_KEY: Final = 0x6167_6E6F_7461  # "agnota"
DEFAULT_BATCH: Final = 20_000


@dataclass
class Notary:
    """One notary's state across cycles: the snapshots whose stragglers it waits out."""

    signer: keys.Signer
    batch: int = DEFAULT_BATCH
    # (xmax of a past snapshot, newest seq it saw), oldest first
    pending: list[tuple[int, int]] = field(default_factory=list)

    async def cycle(self, conn: asyncpg.Connection) -> int:
        """Sequence what is safe and sign a checkpoint per tenant that grew.

        Returns:
            How many leaves were sequenced (0: nothing safe yet, or another notary holds
            the lock).
        """
        async with conn.transaction(isolation="repeatable_read"):
            if not await conn.fetchval(Q["try_lock"], _LOCK_KEY):
                return 0
            snap = await conn.fetchrow(Q["snapshot"])
            assert snap is not None
            cursor, newest = int(snap["cursor"]), int(snap["newest"])
            watermark = cursor
            while self.pending and self.pending[0][0] <= snap["xmin"]:
                watermark = max(watermark, self.pending.pop(0)[1])
            if newest > cursor:
                self.pending.append((int(snap["xmax"]), newest))
            if watermark <= cursor:
                return 0
            rows = await conn.fetch(Q["new_leaves"], cursor, watermark, self.batch)
            if len(rows) == self.batch:  # more to come: stop at the last row read, and
                self.pending.insert(0, (0, watermark))  # the rest is still safe next cycle
                watermark = int(rows[-1]["seq"])
            await self._append(conn, rows)
            await conn.execute(Q["advance_cursor"], watermark)
            return len(rows)

    async def _append(self, conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> None:
        by_tenant: dict[UUID, list[asyncpg.Record]] = defaultdict(list)
        for row in rows:
            by_tenant[row["tenant_id"]].append(row)
        if not by_tenant:
            return
        heads = {r["tenant_id"]: r for r in await conn.fetch(Q["heads"], list(by_tenant))}
        now = datetime.now(UTC)
        for tenant, leaves in by_tenant.items():
            head = heads.get(tenant)
            size = int(head["tree_size"]) if head else 0
            frontier = [bytes(h) for h in head["frontier"]] if head else []
            idx, seqs, hashes = [], [], []
            for row in leaves:
                h = bytes(row["leaf_hash"])
                frontier = merkle.append(frontier, size, h)
                idx.append(size)
                seqs.append(int(row["seq"]))
                hashes.append(h)
                size += 1
            root = merkle.frontier_root(frontier)
            signed = checkpoint.sign(self.signer, tenant_id=str(tenant), tree_size=size,
                                     root_hash=root, at=now)
            await conn.execute(Q["append_leaves"], tenant, idx, seqs, hashes)
            await conn.execute(Q["insert_checkpoint"], tenant, size, root, seqs[-1],
                               signed.key_id, now, signed.body, signed.signature, frontier)
            await conn.execute(Q["publish_checkpoint"], tenant, json.dumps(signed.to_json()))


async def catch_up(conn: asyncpg.Connection, notary: Notary, *, timeout_s: float = 30.0,
                   poll_s: float = 0.05) -> int:
    """Cycle until every audit row committed before the call is sequenced (tests, the demo).

    Raises:
        TimeoutError: a transaction older than the call is still open after ``timeout_s``.
    """
    target = int(await conn.fetchval("SELECT coalesce(max(seq), 0) FROM audit_event"))
    done = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while int(await conn.fetchval("SELECT last_seq FROM audit_notary_cursor")) < target:
        if loop.time() > deadline:
            raise TimeoutError("the notary could not reach the newest audit row in time")
        n = await notary.cycle(conn)
        done += n
        if n == 0:
            await asyncio.sleep(poll_s)  # a cycle that waits for the next snapshot, not a test
    return done


async def run(conn: asyncpg.Connection, notary: Notary, *, interval_s: float,
              stop: asyncio.Event) -> None:
    """Cycle every ``interval_s`` until ``stop`` is set."""
    while not stop.is_set():
        n = await notary.cycle(conn)
        if n:
            log.info("sequenced %d audit leaves", n)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            pass
