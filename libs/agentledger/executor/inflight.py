"""Bounded concurrent work with a graceful drain.

The executor acks a record once its command is durably claimed and completes the call in
the background, so throughput is not capped at partitions ÷ provider latency. This bounds
how many calls are in flight and lets shutdown wait for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class InFlight:
    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def reserve(self) -> None:
        """Wait for a free slot (backpressure on the consumer)."""
        await self._slots.acquire()

    def cancel_reservation(self) -> None:
        self._slots.release()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in a reserved slot; the slot frees when it ends."""
        task = asyncio.create_task(work)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            self._slots.release()
            if not t.cancelled() and t.exception() is not None:
                log.error("event=inflight_failed error=%r", t.exception())

        task.add_done_callback(done)

    @property
    def count(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout: float) -> int:
        """Wait for in-flight work; returns how many were still running at the deadline.

        Work still running at the deadline is cancelled: its claims stay until their lease
        expires, and the reconciler recovers them by contract.
        """
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        return len(pending)
