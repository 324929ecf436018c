"""Batch commit: items of one tenant that arrive together are written by set-based statements
in ONE transaction (issue 41 §2), each item falling back to its per-row path when the batch
cannot be written.

:class:`groupcommit.GroupCommit` shares a transaction between units that each still send their
own statements; a :class:`BatchCommit` hands the whole batch to one *body* that sends one
statement per step for all its items (admission: one principal read, one admitting
statement). :meth:`BatchCommit.run` queues an item; one leader per tenant takes every item
queued for that tenant (up to ``max_batch``) and runs the body in one transaction. While a
tenant's batch is in its transaction the next items queue, so batches form under load and a
lone item runs at once, alone.

A lone item, and every item of a batch that failed, runs ``alone``: the per-row path, exactly
as without batching. Isolation is kept by falling back, as group commit does: when the body
raises (a class 22/23 error of one row's data, a lost connection), the transaction rolls back
whole and EVERY item of the batch runs alone once, so one row's bad data never aborts
another's work and its own error (never retried when it is its data's: class 22/23) reaches
its caller alone. The body answers cases it does not write set-based (a replay, a budget
without room) by the per-row statements inside the same transaction, so those need no
fallback. A COMMIT whose answer was lost is not run again: every caller of the batch gets the
error, as each would alone.

Why by hand: as for ``groupcommit``, asyncpg has no batching of a caller's transactions.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from uuid import UUID

import asyncpg

from agentledger import errors
from agentledger.ledger import repository

log = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")

# Items of one batch share one statement per step: a bound keeps the arrays (and the
# statement's locks and time under the transaction's timeout) small; a consumer batch is
# handled at most ``concurrency`` (32 in admission) records at a time anyway.
MAX_BATCH = 64


@dataclass(slots=True)
class _Queued(Generic[P, R]):
    item: P
    done: asyncio.Future[R]
    # The caller's context: its per-row path runs in (a copy of) it, so its spans are
    # children of the caller's span and not of whichever caller started the leader.
    context: contextvars.Context


@dataclass
class Stats:
    """Counters for tests and the benchmark."""

    batches: int = 0  # transactions that held more than one item and committed
    batched_items: int = 0  # items committed in those
    alone: int = 0  # items that ran their per-row path
    fallbacks: int = 0  # batches rolled back and run again item by item


@dataclass
class BatchCommit(Generic[P, R]):
    """Writes the items of one tenant that overlap in one set-based transaction."""

    pool: asyncpg.Pool
    # The batch inside its transaction (bound to the tenant): one answer per item, in order.
    body: Callable[[repository.Conn, Sequence[P]], Awaitable[Sequence[R]]]
    # One item's per-row path, in a transaction of its own (e.g. through group commit).
    alone: Callable[[P], Awaitable[R]]
    max_batch: int = MAX_BATCH
    timeout: float = repository.DEFAULT_TX_TIMEOUT_S
    stats: Stats = field(default_factory=Stats)
    _queues: dict[UUID, list[_Queued[P, R]]] = field(default_factory=dict, init=False)
    _tasks: dict[UUID, asyncio.Task[None]] = field(default_factory=dict, init=False)

    def log_stats(self) -> None:
        """One log line of what batching did (at a service's stop)."""
        s = self.stats
        log.info("event=batch_commit_stats batches=%d batched_items=%d alone=%d fallbacks=%d",
                 s.batches, s.batched_items, s.alone, s.fallbacks)

    async def run(self, tenant_id: UUID, item: P) -> R:
        """Write ``item`` (in a batch of its tenant, or alone) and return its answer once its
        transaction is committed; raises what its per-row path raises."""
        if self.max_batch <= 1:
            return await self._alone(item)
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(tenant_id, []).append(
            _Queued(item, done, contextvars.copy_context()))
        if tenant_id not in self._tasks:
            task = asyncio.create_task(self._lead(tenant_id))
            self._tasks[tenant_id] = task
        # A caller that gives up (cancelled) leaves its item to run or be skipped: an item
        # that committed is as durable as one whose caller crashed after the commit.
        return await done

    async def _lead(self, tenant_id: UUID) -> None:
        try:
            while batch := self._take(tenant_id):
                try:
                    await self._run_batch(tenant_id, batch)
                except BaseException as exc:  # never leave a caller waiting forever
                    for queued in batch:
                        _fail(queued.done, exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            del self._tasks[tenant_id]

    def _take(self, tenant_id: UUID) -> list[_Queued[P, R]]:
        queue = self._queues.pop(tenant_id, [])
        live = [q for q in queue if not q.done.done()]
        if len(live) > self.max_batch:
            self._queues[tenant_id] = live[self.max_batch:]
        return live[:self.max_batch]

    async def _run_batch(self, tenant_id: UUID, batch: list[_Queued[P, R]]) -> None:
        if len(batch) == 1:
            await self._settle_alone(batch[0])
            return
        committing = False
        try:
            async with self.pool.acquire() as conn:
                async with repository.transaction(conn, tenant_id, timeout=self.timeout) as tx:
                    answers = await self.body(tx, [q.item for q in batch])
                    if len(answers) != len(batch):
                        raise AssertionError("a batch body answers one result per item")
                    committing = True
        except Exception as exc:
            if committing and not _rolled_back(exc):
                # The COMMIT's answer was lost: it may have happened. Running the items again
                # would write them twice; each caller gets the error, as alone.
                for queued in batch:
                    _fail(queued.done, exc)
                return
            failed: BaseException = exc
        else:
            self.stats.batches += 1
            self.stats.batched_items += len(batch)
            for queued, answer in zip(batch, answers, strict=True):
                if not queued.done.done():
                    queued.done.set_result(answer)
            return
        # Nothing of the batch committed: every item runs its per-row path once, alone.
        self.stats.fallbacks += 1
        log.info("event=batch_fallback items=%d error=%r", len(batch), failed)
        await asyncio.gather(*(self._settle_alone(queued) for queued in batch))

    async def _settle_alone(self, queued: _Queued[P, R]) -> None:
        try:
            answer = await asyncio.create_task(self._alone(queued.item),
                                               context=queued.context.copy())
        except Exception as exc:
            _fail(queued.done, exc)
        else:
            if not queued.done.done():
                queued.done.set_result(answer)

    async def _alone(self, item: P) -> R:
        self.stats.alone += 1
        return await self.alone(item)


# SQLSTATE classes a COMMIT answers with when it did not commit (a deferred constraint, a
# serialization failure): the items may run again, alone.
_ROLLED_BACK_CLASSES = frozenset({"22", "23", "40"})


def _rolled_back(exc: BaseException) -> bool:
    return (isinstance(exc, errors.StorageError)
            and str(exc.details.get("sqlstate") or "")[:2] in _ROLLED_BACK_CLASSES)


def _fail(done: asyncio.Future[Any], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
