"""The reconciler's "may still act" window (issue 18 §1) from the bound each attempt's pre-call
mark recorded (migration 0052, issue 41 §6)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentledger.ledger import dispatch

LEASE = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def _attempt(*, sent: bool = True, finished: bool = False,
             bound: float | None = None) -> dict[str, Any]:
    return {"sent_at": LEASE - timedelta(seconds=3) if sent else None,
            "finished_at": LEASE if finished else None, "call_bound_s": bound}


def _at(seconds_past_lease: float) -> datetime:
    return LEASE + timedelta(seconds=seconds_past_lease)


def test_the_window_is_the_lease_plus_the_bound_the_attempt_recorded() -> None:
    tried = [_attempt(bound=3.0)]
    assert dispatch.may_still_act(tried, LEASE, now=_at(2.9))
    assert not dispatch.may_still_act(tried, LEASE, now=_at(3.0))


def test_an_attempt_without_a_recorded_bound_gets_the_longest_any_worker_may_use() -> None:
    # Marked before 0052: its worker's override is unknown, up to MAX_CALL_S.
    tried = [_attempt(bound=None)]
    edge = dispatch.MAX_CALL_S + dispatch.CALL_MARGIN_S
    assert dispatch.may_still_act(tried, LEASE, now=_at(edge - 0.1))
    assert not dispatch.may_still_act(tried, LEASE, now=_at(edge))


def test_the_longest_open_sent_attempt_decides_and_closed_or_unsent_ones_none() -> None:
    tried = [_attempt(bound=3.0), _attempt(bound=9.0), _attempt(bound=20.0, finished=True),
             _attempt(sent=False, bound=None)]
    assert dispatch.may_still_act(tried, LEASE, now=_at(8.9))
    assert not dispatch.may_still_act(tried, LEASE, now=_at(9.0))
    # Nothing open that was sent: nothing may act, whatever the lease.
    assert not dispatch.may_still_act(tried[2:], LEASE, now=_at(0.0))
    assert not dispatch.may_still_act(tried, None, now=_at(0.0))
