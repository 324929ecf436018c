"""Which LSN the relay may confirm to its replication slot.

The slot forgets every transaction whose commit ends at or before the confirmed (flush)
LSN. So the relay confirms a transaction's ``end_lsn`` only when every record of it and of
every earlier transaction has a successful Kafka delivery report AND its outbox rows are
swept. Sweeping before confirming means a crash can only leave rows whose publication is
unconfirmed, and those are streamed again on restart: nothing is lost, nothing is orphaned.

Pure bookkeeping, no I/O: the streaming loop feeds it events in order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Transaction:
    """One committed transaction's records while they are in flight."""

    commit_time_us: int
    final_lsn: int
    end_lsn: int | None = None  # set by the Commit message
    pending: int = 0  # records produced and not yet acknowledged
    failed: bool = False
    xid: int | None = None  # the transaction id pgoutput announced
    rows: list[tuple[str, str]] = field(default_factory=list)  # (table, event id) to sweep
    # Headers every record of it carries (its xid and commit LSN), built once.
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def acknowledged(self) -> bool:
        return self.end_lsn is not None and self.pending == 0 and not self.failed


class Checkpoint:
    """Transactions in commit order, and the highest LSN that is safe to confirm."""

    def __init__(self) -> None:
        self._open: Transaction | None = None
        self._queue: deque[Transaction] = deque()
        self.confirmed_lsn = 0
        self.in_flight_records = 0
        # Records acknowledged whose transaction is not swept yet (what a sweep would take),
        # and transactions whose Commit arrived and that are not swept yet (an empty one
        # has no record, and still moves the confirmed LSN).
        self.acked_records = 0
        self.committed = 0

    def begin(self, final_lsn: int, commit_time_us: int, xid: int | None = None) -> Transaction:
        """Start tracking the transaction announced by a Begin message."""
        if self._open is not None:
            raise RuntimeError("Begin inside an open transaction")
        self._open = Transaction(commit_time_us=commit_time_us, final_lsn=final_lsn, xid=xid)
        self._queue.append(self._open)
        return self._open

    def add(self, txn: Transaction, table: str, event_id: str) -> None:
        """One record of ``txn`` is about to be produced."""
        txn.pending += 1
        txn.rows.append((table, event_id))
        self.in_flight_records += 1

    def commit(self, end_lsn: int) -> Transaction:
        """The open transaction's Commit message arrived."""
        txn = self._open
        if txn is None:
            raise RuntimeError("Commit without Begin")
        txn.end_lsn = end_lsn
        self._open = None
        self.committed += 1
        return txn

    def delivered(self, txn: Transaction, ok: bool) -> None:
        """A delivery report for one record of ``txn``."""
        txn.pending -= 1
        self.in_flight_records -= 1
        if ok:
            self.acked_records += 1
        else:
            txn.failed = True

    def event_ids(self) -> set[str]:
        """Event ids of every record received and not yet confirmed (for the backstop)."""
        return {event_id for txn in self._queue for _, event_id in txn.rows}

    @property
    def has_failure(self) -> bool:
        return any(t.failed for t in self._queue)

    @property
    def idle(self) -> bool:
        """Nothing received is still unconfirmed."""
        return not self._queue

    def sweepable(self, limit: int) -> tuple[list[Transaction], list[tuple[str, str]]]:
        """The leading acknowledged transactions, with up to about ``limit`` rows.

        Always at least one transaction when the head is acknowledged, so a transaction
        with more rows than ``limit`` still moves on.
        """
        txns: list[Transaction] = []
        rows: list[tuple[str, str]] = []
        for txn in self._queue:
            if not txn.acknowledged or (txns and len(rows) + len(txn.rows) > limit):
                break
            txns.append(txn)
            rows.extend(txn.rows)
        return txns, rows

    def swept(self, txns: list[Transaction]) -> int:
        """The rows of ``txns`` (the queue head) are deleted; returns the new confirmed LSN."""
        for txn in txns:
            head = self._queue.popleft()
            if head is not txn or txn.end_lsn is None:
                raise RuntimeError("swept transactions out of commit order")
            self.confirmed_lsn = max(self.confirmed_lsn, txn.end_lsn)
            self.acked_records -= len(txn.rows)
            self.committed -= 1
        return self.confirmed_lsn
