"""The slot is confirmed only past transactions fully acknowledged and swept, in order."""

from __future__ import annotations

from agentledger.relay import checkpoint


def test_confirms_in_commit_order_only() -> None:
    cp = checkpoint.Checkpoint()
    first = cp.begin(final_lsn=100, commit_time_us=1)
    cp.add(first, "command_outbox", "a")
    cp.add(first, "event_outbox", "b")
    cp.commit(end_lsn=110)
    second = cp.begin(final_lsn=200, commit_time_us=2)
    cp.add(second, "command_outbox", "c")
    cp.commit(end_lsn=210)

    cp.delivered(second, ok=True)  # the later transaction is acknowledged first
    assert cp.sweepable(100) == ([], [])
    cp.delivered(first, ok=True)
    assert cp.sweepable(100) == ([], [])  # one record of `first` still in flight
    cp.delivered(first, ok=True)
    txns, rows = cp.sweepable(100)
    assert txns == [first, second]
    assert rows == [("command_outbox", "a"), ("event_outbox", "b"), ("command_outbox", "c")]
    assert cp.swept(txns) == 210
    assert cp.idle and cp.in_flight_records == 0


def test_uncommitted_or_failed_transactions_hold_the_position() -> None:
    cp = checkpoint.Checkpoint()
    txn = cp.begin(final_lsn=100, commit_time_us=1)
    cp.add(txn, "command_outbox", "a")
    cp.delivered(txn, ok=True)
    assert cp.sweepable(10) == ([], [])  # no Commit seen yet
    cp.commit(end_lsn=110)
    later = cp.begin(final_lsn=200, commit_time_us=2)
    cp.add(later, "command_outbox", "b")
    cp.commit(end_lsn=210)
    cp.delivered(later, ok=False)
    assert cp.has_failure
    txns, _ = cp.sweepable(10)
    assert txns == [txn]
    assert cp.swept(txns) == 110  # never past the failed one


def test_sweep_batches_respect_the_limit_but_always_progress() -> None:
    cp = checkpoint.Checkpoint()
    for lsn in (100, 200):
        txn = cp.begin(final_lsn=lsn, commit_time_us=1)
        for i in range(3):
            cp.add(txn, "event_outbox", f"{lsn}-{i}")
            cp.delivered(txn, ok=True)
        cp.commit(end_lsn=lsn + 10)
    txns, rows = cp.sweepable(2)
    assert len(txns) == 1 and len(rows) == 3
    assert cp.swept(txns) == 110


def test_empty_transactions_confirm_immediately() -> None:
    cp = checkpoint.Checkpoint()
    cp.begin(final_lsn=100, commit_time_us=1)
    cp.commit(end_lsn=110)
    txns, rows = cp.sweepable(10)
    assert rows == [] and cp.swept(txns) == 110


def test_counts_what_a_sweep_would_take() -> None:
    # The streaming loop sweeps at a row count or on a timer (issue 41): it reads these
    # counters instead of walking the queue after every acknowledgement.
    cp = checkpoint.Checkpoint()
    empty = cp.begin(final_lsn=50, commit_time_us=1)
    cp.commit(end_lsn=60)
    assert (cp.acked_records, cp.committed) == (0, 1)  # no record, still to be confirmed
    txn = cp.begin(final_lsn=100, commit_time_us=1)
    cp.add(txn, "command_outbox", "a")
    cp.add(txn, "event_outbox", "b")
    cp.delivered(txn, ok=True)
    assert (cp.acked_records, cp.committed) == (1, 1)  # Commit not seen yet
    cp.delivered(txn, ok=True)
    cp.commit(end_lsn=110)
    assert (cp.acked_records, cp.committed) == (2, 2)
    txns, rows = cp.sweepable(100)
    assert txns == [empty, txn] and len(rows) == 2
    assert cp.swept(txns) == 110
    assert (cp.acked_records, cp.committed) == (0, 0)


def test_a_failed_record_is_not_counted_as_acknowledged() -> None:
    cp = checkpoint.Checkpoint()
    txn = cp.begin(final_lsn=100, commit_time_us=1)
    cp.add(txn, "command_outbox", "a")
    cp.add(txn, "command_outbox", "b")
    cp.delivered(txn, ok=True)
    cp.delivered(txn, ok=False)
    cp.commit(end_lsn=110)
    assert cp.acked_records == 1 and cp.sweepable(100) == ([], [])
