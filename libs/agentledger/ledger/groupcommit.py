"""Group commit: concurrent units of work of one tenant share one ledger transaction.

A *unit* is a coroutine function of a connection that opens its own
``repository.transaction(conn, tenant_id)`` — exactly what it does when it runs alone (the
executor's claim, its pre-call mark, a finalize). :meth:`GroupCommit.run` queues the unit;
a *leader* task takes every unit queued for the same tenant (up to ``max_group``) and runs
them one after another inside ONE transaction: each unit's own ``transaction()`` *joins* it
(no BEGIN, no COMMIT, no savepoint), and the group ends in one COMMIT — one WAL flush and
two round trips for the whole group instead of for each unit.

Groups form only under load: while fewer than ``leaders`` groups are running, a new unit
starts a leader at once, so a trickle runs one unit per transaction with no added wait. Units
that arrive together (the claims of one Kafka batch, the finalizes of calls that ended
together) are grouped.

Isolation is kept by falling back, never by savepoints (which would cost more round trips
than the group saves): when any unit of a group raises, or a ``transaction()`` it opened
failed (even one the unit caught), the group rolls back and EVERY unit runs again alone, in
its own transaction, through the same code as without grouping. So one unit's conflict,
refusal or bad data never aborts another's work, and every caller sees exactly what running
alone gives. A unit must therefore be safe to run again after a rollback: its effects are
its transaction's, and what it does in memory before returning must not matter twice (a
span or a counter may be seen twice when its group fell back). A COMMIT whose answer was
lost is not run again: every caller of the group gets the error, as each would alone (a
COMMIT the server refused — a deferred constraint — rolled back, and does fall back).

Why by hand: asyncpg has no group commit or pipelining, and the libraries that batch
(job queues such as procrastinate) batch their own statements, not a caller's transaction.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from uuid import UUID

import asyncpg

from agentledger import errors, faults
from agentledger.ledger import repository

log = logging.getLogger(__name__)

R = TypeVar("R")
Unit = Callable[[repository.Conn], Coroutine[Any, Any, R]]

# Units of one group run one after another on one connection: a bound on the group keeps
# the last unit's wait short (a claim is ~5 statements of well under a millisecond each).
MAX_GROUP = 16
LEADERS = 4
# Runs of one unit alone when it is a deadlock victim: each loser waits for the winner's
# commit, so a second run rarely meets the same cycle; three bound the rare third.
ALONE_ATTEMPTS = 3


@dataclass(slots=True)
class _Queued(Generic[R]):
    unit: Unit[R]
    done: asyncio.Future[R]
    # The caller's context: the unit runs in (a copy of) it, so its spans are children of
    # the caller's span and not of whichever caller started the leader.
    context: contextvars.Context


@dataclass
class Stats:
    """Counters for tests and the benchmark."""

    groups: int = 0  # transactions that held more than one unit and committed
    grouped_units: int = 0  # units committed in those
    alone: int = 0  # units that ran in a transaction of their own
    fallbacks: int = 0  # groups rolled back and run again unit by unit


@dataclass
class GroupCommit:
    """Runs units of work of one tenant together in one transaction when they overlap."""

    pool: asyncpg.Pool
    leaders: int = LEADERS
    max_group: int = MAX_GROUP
    timeout: float = repository.DEFAULT_TX_TIMEOUT_S
    stats: Stats = field(default_factory=Stats)
    _queues: dict[UUID, deque[_Queued[Any]]] = field(default_factory=dict, init=False)
    _running: int = field(default=0, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def log_stats(self) -> None:
        """One log line of what grouping did (at a service's stop)."""
        s = self.stats
        log.info("event=group_commit_stats groups=%d grouped_units=%d alone=%d fallbacks=%d",
                 s.groups, s.grouped_units, s.alone, s.fallbacks)

    async def run(self, tenant_id: UUID, unit: Unit[R]) -> R:
        """Run ``unit`` (alone, or in a group of the same tenant) and return its result once
        its transaction is committed; raises what the unit raises when it runs alone."""
        if self.max_group <= 1:
            return await self._alone(unit)
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(tenant_id, deque()).append(
            _Queued(unit, done, contextvars.copy_context()))
        if self._running < self.leaders:
            self._running += 1
            task = asyncio.create_task(self._lead())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A caller that gives up (cancelled) leaves its unit to run or be skipped: a unit
        # that committed is as durable as one whose caller crashed after the commit.
        return await done

    async def run_alone(self, unit: Unit[R]) -> R:
        """Run ``unit`` in a transaction of its own, never grouped (a unit that already
        failed in a batch: grouping it again would meet its failure once more)."""
        return await self._alone(unit)

    async def _lead(self) -> None:
        try:
            while (taken := self._take()) is not None:
                tenant_id, group = taken
                try:
                    await self._run_group(tenant_id, group)
                except BaseException as exc:  # never leave a caller waiting forever
                    for queued in group:
                        _fail(queued.done, exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._running -= 1

    def _take(self) -> tuple[UUID, list[_Queued[Any]]] | None:
        """The oldest tenant's queued units (up to ``max_group``), skipping abandoned ones."""
        while self._queues:
            tenant_id, queue = next(iter(self._queues.items()))
            group: list[_Queued[Any]] = []
            while queue and len(group) < self.max_group:
                queued = queue.popleft()
                if not queued.done.done():
                    group.append(queued)
            if not queue:
                del self._queues[tenant_id]
            if group:
                return tenant_id, group
        return None

    async def _run_group(self, tenant_id: UUID, group: list[_Queued[Any]]) -> None:
        if len(group) == 1:
            await self._settle_alone(group[0])
            return
        results: list[Any] = []
        failed: BaseException | None = None
        committing = False
        try:
            async with self.pool.acquire() as conn:
                async with repository.transaction(conn, tenant_id, timeout=self.timeout) as tx:
                    join = repository.Join(tx, tenant_id)
                    for queued in group:
                        context = queued.context.copy()
                        context.run(repository.join, join)
                        results.append(await asyncio.create_task(queued.unit(tx),
                                                                 context=context))
                        if join.failed:
                            break
                    if join.failed:
                        raise _Fallback()
                    await faults.point("groupcommit.before_commit")
                    committing = True
        except _Fallback:
            failed = None
        except Exception as exc:
            if committing and not _rolled_back(exc):
                # The COMMIT's answer was lost: it may have happened. Running the units again
                # would do their work twice; each caller gets the error, as alone.
                for queued in group:
                    _fail(queued.done, exc)
                return
            failed = exc
        else:
            self.stats.groups += 1
            self.stats.grouped_units += len(group)
            for queued, result in zip(group, results, strict=True):
                if not queued.done.done():
                    queued.done.set_result(result)
            return
        # A unit raised, or a transaction it opened failed: nothing of the group committed.
        self.stats.fallbacks += 1
        log.debug("event=group_fallback units=%d error=%r", len(group), failed)
        await asyncio.gather(*(self._settle_alone(queued) for queued in group))

    async def _settle_alone(self, queued: _Queued[Any]) -> None:
        try:
            result = await asyncio.create_task(self._alone(queued.unit),
                                               context=queued.context.copy())
        except Exception as exc:
            _fail(queued.done, exc)
        else:
            if not queued.done.done():
                queued.done.set_result(result)

    async def _alone(self, unit: Unit[R]) -> R:
        self.stats.alone += 1
        for attempt in range(1, ALONE_ATTEMPTS + 1):
            try:
                async with self.pool.acquire() as conn:
                    return await unit(conn)
            except errors.StorageError as exc:
                # A unit alone can still be the victim of a deadlock with a group of its
                # tenant (a group locks its units' rows in their order, e.g. two budget
                # windows); the victim's transaction rolled back whole, and a unit is safe
                # to run again after a rollback: bounded, it runs again.
                if attempt == ALONE_ATTEMPTS or exc.details.get("sqlstate") not in _TRANSIENT:
                    raise
                log.debug("event=unit_retried_alone attempt=%d error=%r", attempt, exc)
        raise AssertionError("unreachable")


class _Fallback(Exception):
    """A unit of the group failed (possibly caught by itself): roll back, run each alone."""


# Deadlock victim, serialization failure: the transaction rolled back and may run again.
_TRANSIENT = frozenset({"40P01", "40001"})

# SQLSTATE classes a COMMIT answers with when it did not commit (a deferred constraint, a
# serialization failure): the units may run again, alone.
_ROLLED_BACK_CLASSES = frozenset({"22", "23", "40"})


def _rolled_back(exc: BaseException) -> bool:
    return (isinstance(exc, errors.StorageError)
            and str(exc.details.get("sqlstate") or "")[:2] in _ROLLED_BACK_CLASSES)


def _fail(done: asyncio.Future[Any], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
