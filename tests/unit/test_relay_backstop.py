"""The backstop's bookkeeping: one batch at a time, keyset passes, a pause after each end."""

from __future__ import annotations

import pytest

from agentledger.relay import backstop


def test_a_batch_is_swept_only_when_every_record_is_acknowledged() -> None:
    b = backstop.Backstop(age_s=10, interval_s=5, limit=2)
    assert b.due(now=0.0)
    batch = b.start()
    b.add(batch, "command_outbox", "e1")
    b.add(batch, "event_outbox", "e2")
    assert not b.due(now=100.0) and b.in_flight == 2  # one batch in flight at a time
    with pytest.raises(RuntimeError):
        b.start()
    b.delivered(batch, ok=True)
    assert not batch.acknowledged
    b.delivered(batch, ok=True)
    assert batch.acknowledged and batch.rows == [("command_outbox", "e1"), ("event_outbox", "e2")]
    b.done(batch)
    assert b.batch is None and b.in_flight == 0


def test_one_failed_record_fails_the_batch() -> None:
    b = backstop.Backstop(age_s=10, interval_s=5, limit=2)
    batch = b.start()
    b.add(batch, "command_outbox", "e1")
    b.delivered(batch, ok=False)
    assert not batch.acknowledged


def test_a_full_page_continues_the_pass_and_a_short_one_ends_it() -> None:
    b = backstop.Backstop(age_s=10, interval_s=5, limit=2)
    b.read(2, ("t1", "command_outbox", "e2"))
    assert b.after == ("t1", "command_outbox", "e2") and b.passes == 0
    assert b.due()  # the next page at once
    b.read(1, ("t2", "event_outbox", "e3"))
    assert b.after is None and b.passes == 1  # end of the outbox: next pass from the start
    assert not b.due()  # ...after the pause
    assert b.due(now=b.next_at)
