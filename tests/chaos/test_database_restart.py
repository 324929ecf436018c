"""The ledger's primary crashes and restarts with notes in flight (issue 41 §6), on a private
primary with its synchronous standby (the production shape; tests/standby.py) and real
services.

The CRM executor is first made to stop itself (SIGSTOP) right after its first provider
answer, with a dozen notes claimed and called at once: at the crash, some have their
provider's answer in hand and no outcome recorded, some are claimed and unmarked or marked and
calling, and a few more are admitted and unclaimed. The primary crashes (immediate stop), the
executor resumes against a dead database, the outage outlives every claim's lease (the case
that matters: a lease cannot be renewed while the database is away), then the primary starts
again. Every command must end terminal, with exactly one CRM effect, its audit trail whole;
how long after the heal that took is reported, not asserted.

A second case keeps the worker frozen past the restart until the reconciler has taken its
command over, then crashes the primary again and resumes the worker into that outage: the
outcome it retries, long past its lease, is refused once the primary is back by the token the
take-over replaced, and what the provider told it is recorded on its own attempt as a late
answer, never as the outcome.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest

from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.stack import Stack
from tests.standby import StandbyPair

# Notes claimed together when the executor stops after its first answer, and notes admitted
# while it is stopped (unclaimed at the crash): all of them in flight when the primary dies.
CLAIMED, UNCLAIMED = 12, 4
ANSWERED = "executor.after_remote_write"
# Past every lease in flight at the crash (the 4 s chaos lease), by this much, before the
# primary starts again: the outage outlives the claims.
PAST_LEASE_S = 1.0


@pytest.fixture(scope="module")
def replicated(stack: Stack, make_database: Callable[[], str], standby_pair: StandbyPair,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    # The ledger on the private primary; the CRM (a provider, not our database) and Kafka on
    # the shared stack, so the crash takes only the ledger away.
    with pipeline(stack.kafka_bootstrap, standby_pair.primary_url, make_database(),
                  tmp_path_factory.mktemp("pg-restart"), env=harness.CHAOS_ENV) as p:
        yield p


def _rows(p: Pipeline, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg2.connect(p.database_url, connect_timeout=5) as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _commands(p: Pipeline, ops: list[uuid.UUID]) -> dict[uuid.UUID, tuple[Any, ...]]:
    """Per command: state, fencing generation, lease end, receipt."""
    return {uuid.UUID(str(r[0])): r[1:] for r in _rows(
        p, "SELECT operation_id, state, fencing_generation, lease_until, provider_receipt "
           "FROM agent_command WHERE operation_id = ANY(%s::uuid[])", [str(o) for o in ops])}


def _keys_with_effects(p: Pipeline, baseline: int) -> set[str]:
    import asyncio
    return {e["idempotency_key"] for e in asyncio.run(p.crm.effects(p.tenant))
            if e["effect_id"] > baseline and e["idempotency_key"]}


def _stopped_after_answer(p: Pipeline, ops: dict[uuid.UUID, str], claimed: int) -> int:
    """The CRM executor away while ``claimed`` notes are admitted, then back, armed to stop
    itself after its first provider answer; returns its pid once stopped."""
    svc = p.services["executor-crm"]
    svc.kill()
    submit = harness.note(p, ops)
    for _ in range(claimed):
        submit()
    assert wait_until(lambda: len(_commands(p, list(ops))) == len(ops), timeout=90), \
        harness.unsettled(p, ops)
    harness.restart(p, "executor-crm", f"{ANSWERED}:pause:1")
    svc.env.pop("AGENTLEDGER_FAULT")  # later starts run clean
    assert svc.proc is not None
    pid = svc.proc.pid
    assert wait_until(lambda: harness.stopped(pid), timeout=90), (
        f"the executor never stopped after an answer\n{svc.tail()}")
    return pid


def _crash(p: Pipeline, pair: StandbyPair, ops: list[uuid.UUID]) -> datetime:
    """The primary stopped immediately (a crash); returns the latest lease in flight then."""
    leases = [lease for _, _, lease, _ in _commands(p, ops).values() if lease is not None]
    pair.primary("stop", "immediate")
    return max(leases, default=datetime.now(UTC))


def _heal(pair: StandbyPair) -> float:
    """The primary started again and its standby synchronous again (what the soak calls the
    heal); returns that moment (monotonic)."""
    pair.primary("start")
    assert wait_until(lambda: pair.replication() == ("streaming", "sync"), timeout=120), \
        pair.replication()
    return time.monotonic()


def _audit(p: Pipeline, op: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    return [(r[0], r[1]) for r in _rows(
        p, "SELECT type, payload FROM audit_event WHERE operation_id = %s ORDER BY seq",
        str(op))]


def test_a_primary_restart_longer_than_the_lease_loses_nothing_and_doubles_nothing(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    p, pair = replicated, standby_pair
    assert pair.replication() == ("streaming", "sync"), pair.replication()
    baseline = harness.effect_baseline(p)
    report = harness.PointReport("primary restart past the lease", kills=1)
    ops: dict[uuid.UUID, str] = {}
    pid = _stopped_after_answer(p, ops, CLAIMED)
    try:
        # Admitted while the executor is stopped: published, never claimed before the crash.
        submit = harness.note(p, ops)
        for _ in range(UNCLAIMED):
            submit()
        assert wait_until(lambda: len(_commands(p, list(ops))) == len(ops), timeout=90), \
            harness.unsettled(p, ops)
        at_strike = _commands(p, list(ops))
        answered = {o for o in ops if str(o) in _keys_with_effects(p, baseline)
                    and at_strike[o][0] == "dispatching"}
        in_flight = [o for o, (state, *_) in at_strike.items()
                     if state not in harness.TERMINAL and state != "unknown"]
        leases_end = _crash(p, pair, list(ops))
    finally:
        if harness.stopped(pid):
            os.kill(pid, signal.SIGCONT)  # resumes against a dead database
    struck = time.monotonic()
    # The positive markers the catch needs: every command in flight, some with the provider's
    # answer in hand (the one that stopped the executor at least), some never claimed.
    assert len(in_flight) == len(ops) >= 10, at_strike
    assert answered, at_strike
    assert any(s == "pending" for s, *_ in at_strike.values()), at_strike
    # The outage outlives every lease in flight, then the primary comes back.
    assert wait_until(lambda: (datetime.now(UTC) - leases_end).total_seconds() > PAST_LEASE_S,
                      timeout=60)
    healed = _heal(pair)
    assert wait_until(lambda: all(s in harness.TERMINAL for s, *_ in
                                  _commands(p, list(ops)).values()),
                      timeout=harness.SETTLE_S, interval=0.1), harness.unsettled(p, ops)
    after_heal = time.monotonic() - healed
    final = _commands(p, list(ops))
    kept = [o for o in answered if final[o][1] == at_strike[o][1]]
    # In doubt (the call's bound ran out while the worker was stopped), recorded `unknown` by
    # the claim that called, then settled by the reconciler's lookup.
    doubted = [o for o in answered if any(
        t == "command.unknown" and e["fencing_generation"] == at_strike[o][1]
        for t, e in _audit(p, o))]
    report.seconds = time.monotonic() - struck
    harness.check(p, report, ops, baseline)
    report.notes = [
        f"outage {healed - struck:.1f} s (leases ended {PAST_LEASE_S:g} s+ before the restart); "
        f"{len(in_flight)} in flight at the crash: {len(answered)} answered by the provider "
        f"and unrecorded, {len([s for s, *_ in at_strike.values() if s == 'pending'])} pending",
        f"all terminal {after_heal:.1f} s after the heal",
        f"of the answered: {len(kept)} recorded by the claim that called, {len(doubted)} "
        "recorded `unknown` by it (in doubt) and settled by the reconciler's lookup, "
        f"{len(answered) - len(kept) - len(doubted)} taken over after their lease"]
    harness.save(report)
    print(f"\nprimary restart: all {len(ops)} terminal {after_heal:.1f} s after the heal; "
          f"{report.notes}")
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.unknowns) == (0, 0, 0, 0, 0), report
    assert report.effects == report.commands == len(ops), report
    for op in ops:
        state, generation, lease, receipt = final[op]
        assert (state, lease) == ("succeeded", None) and receipt, (op, final[op])
        trail = _audit(p, op)
        types = [t for t, _ in trail]
        # The trail is whole: claimed by every generation that held it, exactly one outcome,
        # written by the generation the ledger ends on, with the ledger's receipt.
        assert types.count("command.succeeded") == 1, (op, types)
        assert "command.claimed" in types, (op, types)
        (done,) = [payload for t, payload in trail if t == "command.succeeded"]
        assert (done["fencing_generation"], done["receipt"]) == (generation, receipt), \
            (op, done, final[op])
        claimed = {payload["fencing_generation"] for t, payload in trail
                   if t == "command.claimed"}
        assert generation in claimed, (op, trail)


def test_a_worker_frozen_through_the_restart_is_refused_after_a_take_over(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    p, pair = replicated, standby_pair
    assert pair.replication() == ("streaming", "sync"), pair.replication()
    baseline = harness.effect_baseline(p)
    report = harness.PointReport("take-over through a primary restart", kills=1)
    ops: dict[uuid.UUID, str] = {}
    started = time.monotonic()
    pid = _stopped_after_answer(p, ops, 1)
    (op,) = ops
    svc = p.services["executor-crm"]
    since = svc.log.stat().st_size
    try:
        (state, generation, _, _) = _commands(p, [op])[op]
        assert state == "dispatching" and str(op) in _keys_with_effects(p, baseline)
        leases_end = _crash(p, pair, [op])
        assert wait_until(
            lambda: (datetime.now(UTC) - leases_end).total_seconds() > PAST_LEASE_S,
            timeout=60)
        _heal(pair)
        # Still frozen: the reconciler takes the command over (a new token and generation)
        # once its lease and its call bound have run out, looks the key up, records it.
        assert wait_until(lambda: _commands(p, [op])[op][0] in harness.TERMINAL,
                          timeout=harness.SETTLE_S, interval=0.2), harness.unsettled(p, ops)
        taken = _commands(p, [op])[op]
        assert taken[1] > generation, taken
        # The primary crashes again and the stale worker resumes into the outage: its outcome
        # fails on the database, long past its lease, and is retried (the new path).
        pair.primary("stop", "immediate")
    finally:
        if harness.stopped(pid):
            os.kill(pid, signal.SIGCONT)
    retried = f"event=write_retried what=finalize operation_id={op}"
    assert wait_until(lambda: retried in svc.log.read_text(errors="replace")[since:],
                      timeout=60), svc.tail()
    _heal(pair)
    # Once the primary is back its retried outcome is refused by the token the take-over
    # replaced, and what the provider told it is recorded late on its own attempt.
    late = "SELECT late_answer FROM command_attempt WHERE operation_id = %s AND " \
           "fencing_generation = %s AND late_answer IS NOT NULL"
    assert wait_until(lambda: bool(_rows(p, late, str(op), generation)), timeout=90), \
        svc.tail()
    logged = svc.log.read_text(errors="replace")[since:]
    assert "event=fenced_out" in logged and f"operation_id={op}" in logged, svc.tail()
    assert _commands(p, [op])[op] == taken  # nothing of the stale worker's was recorded
    trail = _audit(p, op)
    outcomes = [payload for t, payload in trail if t.startswith("command.succeeded")]
    assert [o["fencing_generation"] for o in outcomes] == [taken[1]], trail
    report.seconds = time.monotonic() - started
    harness.check(p, report, ops, baseline)
    report.notes = [f"stale generation {generation} refused after the take-over to "
                    f"generation {taken[1]}; its answer recorded late"]
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.unknowns) == (0, 0, 0, 0), report
    assert report.effects == report.commands == 1, report
    harness.restart(p, "executor-crm", None)
