"""The failover drill (issue 19 §1): the primary dies while commits wait for its synchronous
standby; the standby is promoted; the services are pointed at it; the relay creates its slot
there (PostgreSQL 15 has no failover slots) and republishes what the outbox still holds.
Nothing admitted may be lost, nothing executed twice, nothing dead-lettered as missing.

The hard moment is made on purpose: the standby is frozen, so the primary's commits park
(flushed, decoded by the relay, invisible), and admission's admit is among them; then the
primary crashes (immediate stop) and the standby, thawed, is promoted without them. The relay
must not have published any of them (an executor would act on a command the new primary
never heard of), and admission, never answered, must admit them again there.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg2
import pytest

from agentledger import logins
from agentledger.ledger import repository
from agentledger.testing.pipeline import Pipeline, pipeline, slot_active
from agentledger.testing.polling import wait_until
from tests import syncrep
from tests.chaos import harness
from tests.stack import Stack
from tests.standby import StandbyPair

pytestmark = harness.long_only

# Every service that talks to the ledger, relay first (its new slot and the republication).
SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")


@pytest.fixture(scope="module")
def replicated(stack: Stack, make_database: Callable[[], str], standby_pair: StandbyPair,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, standby_pair.primary_url, make_database(),
                  tmp_path_factory.mktemp("failover"), env=harness.CHAOS_ENV) as p:
        yield p


def test_failover_to_the_synchronous_standby_loses_nothing_and_runs_nothing_twice(
        replicated: Pipeline, standby_pair: StandbyPair) -> None:
    p, pair = replicated, standby_pair
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport("failover to the sync standby", kills=1)
    assert pair.replication() == ("streaming", "sync"), pair.replication()
    relay = p.services["relay"].log
    since = relay.stat().st_size
    with harness.SteadyLoad(p) as load:
        assert wait_until(lambda: harness.succeeded(p, load.ops()) >= 3, timeout=90), \
            harness.unsettled(p, load.ops())
        admission = harness.pause_before_admit(p)
        try:
            with pair.stalled():
                os.kill(admission, signal.SIGCONT)  # its admit's COMMIT waits for the standby
                # Positive markers: the relay decoded that commit and holds it; admission's
                # admit waits on SyncRep.
                assert wait_until(lambda: bool(syncrep.relay_holds(relay, since)), timeout=60), \
                    p.services["relay"].tail()
                # Past a ledger transaction's own bound, which used to cancel the wait and
                # make the commit visible (and published) on the primary alone (issue 19).
                login = logins.login_name("admission")
                assert wait_until(
                    lambda: pair.parked_s(login) > repository.DEFAULT_TX_TIMEOUT_S + 1,
                    timeout=60), pair.parked()
                parked = pair.parked()
                assert any("command_outbox" in w for w in parked), parked
                held = syncrep.relay_holds(relay, since)
                # The primary dies with those commits parked.
                pair.primary("stop", "immediate")
        finally:
            if harness.stopped(admission):
                os.kill(admission, signal.SIGCONT)
        # The relay died with the primary still holding them: none of its records came
        # from a transaction the standby may not have.
        assert not held & harness.published_xids(p), held
        old_url = p.database_url
        pair.standby("promote")
        assert _in_recovery(pair.standby_url) is False
        failover_at = relay.stat().st_size
        _repoint(p, old_url, pair.standby_url)
        back = load.proposed()
        assert wait_until(lambda: harness.succeeded(p, list(load.ops())[back:]) >= 3,
                          timeout=180), harness.unsettled(p, load.ops())
    ops = load.ops()
    assert harness.settle(p, ops, timeout=240), harness.unsettled(p, ops)
    assert wait_until(lambda: harness.outbox_rows(p) == 0, timeout=120), harness.outbox_rows(p)
    assert wait_until(lambda: harness.exec_lag(p) == 0, timeout=120), harness.exec_lag(p)
    # The relay made its slot on the new primary and published what its outbox still held.
    after = syncrep.log_since(relay, failover_at)
    assert any("event=relay.slot_created" in line for line in after), p.services["relay"].tail()
    republished = [line for line in after if "event=relay.backstop reason=pre_slot" in line]
    report.seconds = time.monotonic() - started
    harness.check(p, report, ops, baseline)
    report.notes = [f"primary crashed with commits parked on SyncRep {parked}, relay holding "
                    f"xids {sorted(held)} (never published)",
                    f"new primary: relay slot created, pre-slot republication {republished}",
                    "outbox drained, exec lag 0"]
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.missing_dead_letters,
            report.unknowns) == (0, 0, 0, 0, 0, 0), report
    assert report.effects == report.commands, report


def _repoint(p: Pipeline, old_url: str, new_url: str) -> None:
    """Every service restarted against the new primary: the same logins (roles and passwords
    came over with the physical copy), another address."""
    old, new = f"@127.0.0.1:{urlsplit(old_url).port}/", f"@127.0.0.1:{urlsplit(new_url).port}/"
    p.database_url = new_url
    slot = p.services["relay"].env["AGENTLEDGER_RELAY_SLOT"]
    p.ready["relay"] = lambda: slot_active(new_url, slot)
    for name in SERVICES:
        svc = p.services[name]
        svc.env = {k: v.replace(old, new) for k, v in svc.env.items()}
        assert new in svc.env["AGENTLEDGER_DATABASE_URL"], name
        harness.restart(p, name, None)


def _in_recovery(url: str) -> bool:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            row = cur.fetchone()
    finally:
        conn.close()
    return bool(row and row[0])
