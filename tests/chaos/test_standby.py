"""The ledger on a primary with a synchronous standby (issue 19 §1): the standby is stalled,
killed and restarted under a steady load of notes. While it is away every commit of the
primary parks — flushed, decodable by the relay's slot, invisible to everyone else — and
nothing may come of that: no command lost, none dispatched twice, none dead-lettered as
missing, and the outbox drains once the standby is back.

Each case first proves the standby really blocked something, seconds into its absence:
admission's commit waits on ``SyncRep`` (``pg_stat_activity``) and no command proposed during
the absence is visible; transactions the relay decoded and holds (a ``visibility_wait`` with no
``visible`` yet) are recorded and must be released after the return. (Under synchronous
replication the relay waits a few milliseconds for almost every transaction — it decodes a
commit as soon as it is flushed, before the standby's acknowledgement makes it visible — so
a ``visibility_wait`` line alone proves nothing.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest

from agentledger import logins
from agentledger.ledger import repository
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests import syncrep
from tests.chaos import harness
from tests.stack import Stack
from tests.standby import StandbyPair

# The standby stays away until admission's parked commit has waited longer than a ledger
# transaction's own bound (5 s): the bound that used to cancel the wait and make the commit
# visible on the primary alone (issue 19). And until the load proposed a few notes meanwhile.
PAST_TX_TIMEOUT_S = repository.DEFAULT_TX_TIMEOUT_S + 1
AWAY_NOTES = 5
# Kill/restart cycles: `make chaos N=200` runs 20.
CYCLES = max(1, harness.KILLS // 10)


@pytest.fixture(scope="module")
def replicated(stack: Stack, make_database: Callable[[], str], standby_pair: StandbyPair,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    # The ledger on the private primary; the CRM (a provider, not our database) and Kafka on
    # the shared stack.
    with pipeline(stack.kafka_bootstrap, standby_pair.primary_url, make_database(),
                  tmp_path_factory.mktemp("standby"), env=harness.CHAOS_ENV) as p:
        yield p


def test_a_stalled_standby_parks_commits_and_nothing_is_lost(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    report = _standby_away(replicated, standby_pair, "standby stall (SIGSTOP)",
                           standby_pair.stalled, _parked_past(standby_pair, PAST_TX_TIMEOUT_S))
    _assert_clean(report)


@harness.long_only
def test_a_stall_past_the_relays_visibility_timeout(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    relay = replicated.services["relay"].log
    since = relay.stat().st_size

    def failed_closed() -> int:
        return len([line for line in syncrep.log_since(relay, since)
                    if "code=relay_not_visible " in line])
    # Away until the relay gave up waiting (30 s) and restarted from its slot (fail closed).
    report = _standby_away(replicated, standby_pair, "standby stall past the relay's timeout",
                           standby_pair.stalled, lambda: failed_closed() >= 1, timeout=120)
    failed = failed_closed()
    report.notes.append(f"relay sessions failed closed on an invisible transaction: {failed}")
    harness.save(report)
    _assert_clean(report)


@harness.long_only
def test_a_killed_standby_restarts_and_nothing_is_lost(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    @contextmanager
    def killed() -> Iterator[None]:
        standby_pair.standby("stop", "immediate")  # a crash: no shutdown checkpoint
        try:
            yield
        finally:
            standby_pair.standby("start")  # recovers, reconnects, catches up through its slot

    total = harness.PointReport("standby kill + restart")
    for _ in range(CYCLES):
        report = _standby_away(replicated, standby_pair, total.point, killed,
                               _parked_past(standby_pair, PAST_TX_TIMEOUT_S), save=False)
        _assert_clean(report)
        for name in ("commands", "effects", "unknowns", "missing_dead_letters"):
            setattr(total, name, getattr(total, name) + getattr(report, name))
        total.kills += 1
        total.seconds += report.seconds
        total.notes = report.notes
    assert "database system was interrupted" in standby_pair.standby_log()  # it did crash
    harness.save(total)


def _standby_away(p: Pipeline, pair: StandbyPair, point: str,
                  away: Callable[[], AbstractContextManager[object]], until: Callable[[], bool],
                  *, timeout: float = 60, save: bool = True) -> harness.PointReport:
    """Steady load; the standby away until ``until()`` holds and the load has proposed
    ``AWAY_NOTES`` notes meanwhile; back; then the invariants, counted into the report."""
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport(point, kills=1)
    assert pair.replication() == ("streaming", "sync"), pair.replication()
    relay = p.services["relay"].log
    since = relay.stat().st_size  # the relay's lines of this case start here
    with harness.SteadyLoad(p) as load:
        # The pipeline completes notes through the synchronous pair before the fault.
        assert wait_until(lambda: harness.succeeded(p, load.ops()) >= 3, timeout=90), \
            harness.unsettled(p, load.ops())
        # Admission's first write per proposal is its budget reservation, so which of its
        # commits the absence catches is luck. To be sure one of them carries outbox rows
        # (what the relay decodes), admission stops itself just before an admit's COMMIT.
        admission = harness.pause_before_admit(p)
        try:
            with away():
                away_since = time.monotonic()
                os.kill(admission, signal.SIGCONT)  # its COMMIT now waits for the standby
                # The relay decodes that commit (flushed) and holds it (invisible).
                assert wait_until(lambda: bool(syncrep.relay_holds(relay, since)), timeout=60), \
                    p.services["relay"].tail()
                marked = load.proposed()
                assert wait_until(lambda: load.proposed() >= marked + AWAY_NOTES and until(),
                                  timeout=timeout), (load.proposed() - marked, pair.parked())
                # Seconds into the absence: the commits still wait for the standby, the relay
                # still holds what it decoded, and nothing proposed meanwhile is visible.
                during = load.begun_after(away_since)
                parked, held = pair.parked(), syncrep.relay_holds(relay, since)
                visible = harness.states(p, during)
                away_s = time.monotonic() - away_since
                admitting = logins.login_name("admission") + ":"
                assert during and held and visible == {} and any(
                    w.startswith(admitting) and "command_outbox" in w for w in parked), (
                    parked, held, visible)
        finally:
            if harness.stopped(admission):
                os.kill(admission, signal.SIGCONT)  # a stopped process would ignore SIGTERM
        # Back: the load goes on until notes proposed after the return have succeeded too.
        back = load.proposed()
        assert wait_until(lambda: harness.succeeded(p, list(load.ops())[back:]) >= 3,
                          timeout=120), harness.unsettled(p, load.ops())
    ops = load.ops()
    assert harness.settle(p, ops, timeout=180), harness.unsettled(p, ops)
    # What the relay held while the standby was away was published once it was back (an
    # admit's exec record carries its transaction's xid).
    assert held <= harness.published_xids(p), (held, p.services["relay"].tail())
    # The outbox drains, and every exec record was handled: only then is "no dead letter"
    # a finding rather than a reader that looked too early.
    assert wait_until(lambda: harness.outbox_rows(p) == 0, timeout=120), harness.outbox_rows(p)
    assert wait_until(lambda: harness.exec_lag(p) == 0, timeout=120), harness.exec_lag(p)
    report.seconds = time.monotonic() - started
    harness.check(p, report, ops, baseline)
    report.notes = [f"away {away_s:.0f} s; {len(during)} notes proposed meanwhile, none visible "
                    "until the return",
                    f"at the return: waiting on SyncRep {parked}; relay holding xids "
                    f"{sorted(held)}, published after", "outbox drained, exec lag 0"]
    if save:
        harness.save(report)
    return report


def _parked_past(pair: StandbyPair, seconds: float) -> Callable[[], bool]:
    return lambda: pair.parked_s(logins.login_name("admission")) > seconds


def _assert_clean(report: harness.PointReport) -> None:
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.missing_dead_letters,
            report.unknowns) == (0, 0, 0, 0, 0, 0), report
    assert report.effects == report.commands, report  # one note at the CRM per command

