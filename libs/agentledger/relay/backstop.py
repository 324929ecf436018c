"""The outbox backstop: rows the stream never published are found in the table and published.

The replication slot streams every transaction committed after it was created, once it is
visible. Two kinds of rows can still sit in the outbox with no stream ever to carry them
(issue 18):

- rows committed before the slot existed. The slot's exported snapshot names them, but that
  snapshot dies with its replication connection: a relay that fails, or is killed, between
  creating the slot and publishing them leaves them behind for good (0 of 5 published in the
  reproduction) — and so does a slot lost in a failover and created again;
- any row a race or a bug let the slot move past.

The outbox table itself is the durable record of what is owed: a row leaves it only after
Kafka acknowledged it. So the backstop scans it, in keyset order, for rows older than a few
times the normal relay latency, and publishes and sweeps them like the stream does. Its
progress needs no separate persisted cursor: a killed scan resumes at the oldest row still
owed, because every row before it was acknowledged and deleted. It runs only when the stream
has caught up with the WAL, skips rows the stream has in flight, and republishes at most a
batch at a time, so a healthy relay publishes nothing twice; a row it does duplicate carries
the same event id (executors dedupe by operation id, the audit reader by event id).

Pure bookkeeping, no I/O: the streaming loop does the reading, publishing and sweeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Batch:
    """Outbox rows the backstop published, until every one is acknowledged and swept."""

    rows: list[tuple[str, str]] = field(default_factory=list)  # (table, event id)
    pending: int = 0
    failed: bool = False
    reason: str = "stale"  # why they were published: "stale", or "pre_slot" after creation

    @property
    def acknowledged(self) -> bool:
        return self.pending == 0 and not self.failed


@dataclass(slots=True)
class Backstop:
    """When to scan, where the current pass is, and the one batch in flight.

    Args:
        age_s: rows younger than this are the stream's business and are never scanned.
        interval_s: pause between two passes over the outbox.
        limit: rows read and published per batch.
    """

    age_s: float
    interval_s: float
    limit: int
    next_at: float = 0.0  # monotonic; 0: at the first moment the stream is caught up
    after: tuple[Any, str, str] | None = None  # keyset position inside the current pass
    batch: Batch | None = None
    passes: int = 0  # scans that reached the end of the outbox (reported at a clean stop)

    @property
    def in_flight(self) -> int:
        """Records of the current batch not yet acknowledged."""
        return self.batch.pending if self.batch is not None else 0

    def due(self, now: float | None = None) -> bool:
        """Whether a batch may be read now (none in flight and the pause is over)."""
        return self.batch is None and (time.monotonic() if now is None else now) >= self.next_at

    def start(self, reason: str = "stale") -> Batch:
        """A new batch; the caller adds its rows as it publishes them."""
        if self.batch is not None:
            raise RuntimeError("a backstop batch is already in flight")
        self.batch = Batch(reason=reason)
        return self.batch

    def add(self, batch: Batch, table: str, event_id: str) -> None:
        batch.rows.append((table, event_id))
        batch.pending += 1

    def delivered(self, batch: Batch, ok: bool) -> None:
        batch.pending -= 1
        if not ok:
            batch.failed = True

    def read(self, found: int, last: tuple[Any, str, str] | None) -> None:
        """A scan read ``found`` rows ending at ``last``: continue, or pause after the end."""
        if found < self.limit or last is None:
            self.after = None  # the pass reached the end of the outbox
            self.passes += 1
            self.next_at = time.monotonic() + self.interval_s
        else:
            self.after = last

    def done(self, batch: Batch) -> None:
        """The batch is acknowledged and swept."""
        if self.batch is batch:
            self.batch = None
