"""Set-based statements for concurrent callers (issue 41, lever 1b).

Callers of one tenant that need the same statement at about the same time — the claims of
one Kafka batch, the pre-call marks and the outcomes of calls that end together — submit a
row each; a leader runs ONE statement over all the rows queued for the tenant (arrays,
``unnest``), as one unit of the group commit (so it still shares its transaction and its
COMMIT with the tenant's other units), and hands each caller its own row's result. Rows queue
while a statement runs, so a trickle runs a statement per row with no added wait and a burst
runs one per batch.

Isolation is kept the way group commit keeps it: a statement that raises is run again row by
row, each row in its own unit, so one row's failure is its caller's alone and every caller
sees what running alone gives.

Why by hand: asyncpg has neither pipelining nor statement batching across callers, and the
batching libraries (graphile-worker, River) batch their own job statements, not a caller's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from uuid import UUID

from agentledger import faults
from agentledger.ledger import groupcommit
from agentledger.ledger.repository import Conn

log = logging.getLogger(__name__)

Row = TypeVar("Row")  # one row's input
Out = TypeVar("Out")  # one row's result

# Rows per statement: a bound on one statement's work and its arrays (a claim row is a few
# hundred bytes); a burst beyond it runs as several statements, one after another.
MAX_ROWS = 64


@dataclass
class Stats:
    """Counters for tests and the benchmark."""

    statements: int = 0  # set-based statements run
    rows: int = 0  # rows they carried
    row_by_row: int = 0  # statements that raised and were run again row by row


@dataclass
class Coalescer(Generic[Row, Out]):
    """Runs ``run(conn, tenant_id, rows)`` — one statement over ``rows`` returning one result
    per row, in order — for the rows callers of one tenant submit together."""

    group: groupcommit.GroupCommit
    run: Callable[[Conn, UUID, Sequence[Row]], Coroutine[Any, Any, Sequence[Out]]]
    # Rows of one statement have distinct keys (a command's operation id: the statements
    # match their results to rows by it); a row whose key is taken waits for the next one.
    key: Callable[[Row], Hashable]
    max_rows: int = MAX_ROWS
    stats: Stats = field(default_factory=Stats)
    _queues: dict[UUID, list[tuple[Row, asyncio.Future[Out]]]] = field(default_factory=dict,
                                                                    init=False)
    _leading: set[UUID] = field(default_factory=set, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def submit(self, tenant_id: UUID, row: Row) -> Out:
        """``row``'s result once its statement committed; raises what it raises alone."""
        done: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(tenant_id, []).append((row, done))
        if tenant_id not in self._leading:
            self._leading.add(tenant_id)
            task = asyncio.create_task(self._lead(tenant_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await done

    async def _lead(self, tenant_id: UUID) -> None:
        try:
            # One loop turn, so the callers woken together (a batch's handlers) queue first.
            await asyncio.sleep(0)
            while queue := self._queues.get(tenant_id):
                taken: list[tuple[Row, asyncio.Future[Out]]] = []
                later: list[tuple[Row, asyncio.Future[Out]]] = []
                keys: set[Hashable] = set()
                for row, done in queue:
                    k = self.key(row)
                    if len(taken) < self.max_rows and k not in keys:
                        keys.add(k)
                        taken.append((row, done))
                    else:
                        later.append((row, done))
                if later:
                    self._queues[tenant_id] = later
                else:
                    del self._queues[tenant_id]
                await self._run(tenant_id, [(r, d) for r, d in taken if not d.done()])
        finally:
            # No await since the queue was found empty: a row submitted from now on starts
            # a leader of its own.
            self._leading.discard(tenant_id)

    async def _run(self, tenant_id: UUID, taken: list[tuple[Row, asyncio.Future[Out]]]) -> None:
        if not taken:
            return
        rows = [r for r, _ in taken]
        try:
            results: Sequence[Out] = await self.group.run(
                tenant_id, lambda conn: self.run(conn, tenant_id, rows))
        except Exception as exc:
            if len(taken) == 1:
                _fail(taken[0][1], exc)
                return
            # One row's failure is its own: every row alone, as it would have run.
            self.stats.row_by_row += 1
            log.debug("event=coalesced_row_by_row rows=%d error=%r", len(taken), exc)
            await asyncio.gather(*(self._run(tenant_id, [one]) for one in taken))
            return
        self.stats.statements += 1
        self.stats.rows += len(rows)
        for (_, done), result in zip(taken, results, strict=True):
            if not done.done():
                done.set_result(result)


async def before_commit(rows: Sequence[object]) -> None:
    """The batch boundary of a set-based statement of several commands: written, not yet
    committed — the fault point a group's COMMIT has (``groupcommit.before_commit``), here
    for the rows one statement carried (STYLE rule 19)."""
    if len(rows) > 1:
        await faults.point("groupcommit.before_commit")


def _fail(done: asyncio.Future[Out], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
