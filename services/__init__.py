"""What every service shell wires the same way: signals, topics, the database pool.

A shell names its topics, role and pool size; :func:`started` does the rest in one order
(stop event, topics, pool) and closes the pool however the service ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import asyncpg

from agentledger import db
from agentledger.kafka import topics as kafka_topics


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """The event a service runs until: set by SIGTERM or SIGINT, or by the caller's ``stop``.

    Call from the running event loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def ensure_topics(bootstrap: str, partitions: Mapping[str, int], *,
                        replication: int) -> None:
    """Create the topics a service reads or writes, off the event loop (admin calls block)."""
    await asyncio.to_thread(kafka_topics.ensure, bootstrap, dict(partitions),
                            replication=replication)


@dataclass(frozen=True)
class Running:
    """A started service's shared pieces."""

    stop: asyncio.Event
    pool: asyncpg.Pool


@contextlib.asynccontextmanager
async def started(
    *, database_url: str, role: str | None, pool_size: int, bootstrap: str | None = None,
    topics: Mapping[str, int] | None = None, replication: int = 1,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[Running]:
    """Stop on signals, ensure ``topics``, open the pool as ``role``; close it on the way out.

    Raises:
        errors.ConfigurationError: ``role`` is not a plain identifier.
    """
    event = stop_on_signals(stop)
    if topics and bootstrap is not None:
        await ensure_topics(bootstrap, topics, replication=replication)
    # The whole pool is opened at start and kept (min_size = size): a connection opened under
    # load costs the database a backend, SCRAM authentication, cold catalog caches and
    # asyncpg's type introspection, paid again each time an idle one was closed (issue 41;
    # bench/README.md, "Levers"). Size pools against max_connections (docs/operations.md,
    # "Sizing partitions and executors").
    pool = await db.create_pool(database_url, role=role, size=pool_size, min_size=pool_size)
    try:
        yield Running(event, pool)
    finally:
        await pool.close()
