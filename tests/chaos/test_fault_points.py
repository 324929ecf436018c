"""Kill real services at every named fault point; then no loss, no duplicate, no invented success.

Each test arms one point in one service, kills it ``harness.KILLS`` times while traffic flows,
restarts it clean, lets the system settle within the recovery bound, and checks invariants
over the ledger and the CRM's effect log. Figures go to reports/chaos.json.

``make chaos`` runs every point twice: on the shared stack, and on production's shape — three
brokers (every topic replicated 3 times, ``min.insync.replicas=2``, acks=all) and a ledger
whose commits wait for a synchronous standby (``harness.SHAPES``).
"""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from agentledger.testing import ledger as testing_ledger
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.kafka_cluster import kafka_cluster_running
from tests.stack import Stack
from tests.standby import standby_pair_running

SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")


@pytest.fixture(scope="module", params=harness.SHAPES)
def chaos(request: pytest.FixtureRequest, stack: Stack, database_url: str,
          make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The pipeline on one of ``harness.SHAPES`` (this module's own ``chaos``)."""
    shape = request.param
    assert shape in harness.SHAPE_LABELS, f"unknown chaos shape {shape!r}: one of {list(harness.SHAPE_LABELS)}"
    logs = tmp_path_factory.mktemp(f"chaos-{shape}")
    if shape == "single":
        with pipeline(stack.kafka_bootstrap, database_url, make_database(), logs,
                      env=harness.CHAOS_ENV) as p:
            yield p
        return
    # Production's shape. The fault points restart services, so the chaos settings keep
    # static membership (the brokers stay up here: no coordinator goes away). The CRM is a
    # provider, not our database: it stays on the shared stack.
    env = {name: {**harness.CHAOS_ENV.get(name, {}), "AGENTLEDGER_KAFKA_REPLICATION_FACTOR": "3"}
           for name in SERVICES}
    with kafka_cluster_running() as cluster, standby_pair_running() as pair:
        with pipeline(cluster.bootstrap, pair.primary_url, make_database(), logs, env=env) as p:
            harness.SHAPE = harness.SHAPE_LABELS[shape]
            try:
                yield p
            finally:
                harness.SHAPE = ""
        # Its readiness probes hold admin clients: destroyed while the brokers still answer.
        p.ready.clear()
        gc.collect()


def _assert_zeros(report: harness.PointReport) -> None:
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes) == (0, 0, 0, 0), report


def _run(p: Pipeline, point: str, service: str, *, refunds: bool = False,
         burst: int = 1) -> harness.PointReport:
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport(point)
    ops: dict[uuid.UUID, str] = {}
    for i in range(harness.KILLS):
        harness.restart(p, service, f"{point}:kill:1")
        if refunds:
            op = p.propose("billing.refund.create", {"invoice_id": f"inv-{i}", "amount_minor": 100 + i,
                                                     "currency": "EUR", "reason": "chaos"})
            ops[op] = "refund"
            assert wait_until(lambda op=op: p.pending_approval(op), timeout=60)
            p.approve(op)
        else:
            for _ in range(burst):
                harness.note(p, ops)()
        harness.wait_killed(p, service)
        report.kills += 1
    harness.restart(p, service, None)
    assert harness.settle(p, ops), harness.unsettled(p, ops)
    report.seconds = time.monotonic() - started
    return harness.check(p, report, ops, baseline)


def test_kill_admission_before_its_commit(chaos: Pipeline) -> None:
    report = _run(chaos, "admission.before_commit", "admission")
    assert report.unknowns == 0  # nothing was dispatched twice or lost: all notes succeed
    _assert_zeros(report)


def test_kill_admission_halfway_through_publishing_a_batchs_answers(chaos: Pipeline) -> None:
    # Issue 20: a batch's commands are committed, half its answers produced, none delivered
    # for sure, no offset committed: the batch is redelivered and replays; nothing doubles.
    report = _run(chaos, "batch.mid_publish", "admission", burst=5)
    assert report.unknowns == 0
    _assert_zeros(report)


def test_kill_admission_after_its_answers_before_the_offset_commit(chaos: Pipeline) -> None:
    report = _run(chaos, "batch.before_offset_commit", "admission", burst=5)
    assert report.unknowns == 0
    _assert_zeros(report)


def test_kill_executor_after_commit_before_dispatch(chaos: Pipeline) -> None:
    report = _run(chaos, "executor.after_claim", "executor-crm")
    assert report.unknowns == 0  # keyed: the reconciler requeues and the key dedupes
    _assert_zeros(report)


def test_kill_executor_inside_a_group_commit_before_its_commit(chaos: Pipeline) -> None:
    # Issue 20: the claims of records that arrive together share one transaction. Killed
    # with every claim of the group written and its one COMMIT not sent: none of them is
    # claimed and no offset moved; the restarted executor claims and sends each once.
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    report = harness.PointReport("groupcommit.before_commit")
    executor = chaos.services["executor-crm"]
    ops: dict[uuid.UUID, str] = {}
    submit = harness.note(chaos, ops)
    for _ in range(harness.KILLS):
        harness.restart(chaos, "executor-crm", "groupcommit.before_commit:kill:1")
        # A group forms when records reach the executor together: the executor is stopped
        # while a burst's exec records land in its topic, then resumed to find them all.
        # Should they still come one by one, another burst follows (bounded).
        deadline = time.monotonic() + 90
        while executor.alive() and time.monotonic() < deadline:
            pid = executor.proc.pid if executor.proc else 0
            os.kill(pid, signal.SIGSTOP)
            try:
                before = harness.exec_lag(chaos)
                for _ in range(5):
                    submit()
                assert wait_until(lambda before=before: harness.exec_lag(chaos) >= before + 5,
                                  timeout=60), "the burst's exec records never arrived"
            finally:
                os.kill(pid, signal.SIGCONT)
            wait_until(lambda: not executor.alive(), timeout=10)
        harness.wait_killed(chaos, "executor-crm")
        report.kills += 1
    harness.restart(chaos, "executor-crm", None)
    assert harness.settle(chaos, ops), harness.unsettled(chaos, ops)
    report.seconds = time.monotonic() - started
    report = harness.check(chaos, report, ops, baseline)
    assert report.unknowns == 0  # nothing was sent under the lost claims
    _assert_zeros(report)


def test_kill_executor_after_the_remote_write_before_the_receipt(chaos: Pipeline) -> None:
    report = _run(chaos, "executor.after_remote_write", "executor-crm")
    assert report.unknowns == 0  # keyed with lookup: the reconciler finds the effect
    _assert_zeros(report)


def test_kill_billing_executor_after_its_claim_sends_each_refund_once(chaos: Pipeline) -> None:
    # Issue 17 §4: killed after the claim, before any call: nothing reached the provider, so
    # even a provider that can neither dedupe nor be asked gets each refund exactly once —
    # the expired claim carries no pre-call stamp and is requeued, never `unknown`.
    report = _run(chaos, "executor.after_claim", "executor-billing", refunds=True)
    report.point = "executor.after_claim (billing)"
    assert report.unknowns == 0, report
    _assert_zeros(report)
    assert report.effects == report.commands, report


def test_kill_billing_executor_after_the_remote_write_leaves_unknown(chaos: Pipeline) -> None:
    # Non-idempotent provider, lost answer: `unknown`, never an invented success.
    report = _run(chaos, "executor.after_remote_write", "executor-billing", refunds=True)
    report.point = "executor.after_remote_write (billing)"
    assert report.unknowns == report.commands  # every lost answer stays unknown for an operator
    _assert_zeros(report)


def test_kill_executor_after_the_receipt_before_the_ack(chaos: Pipeline) -> None:
    report = _run(chaos, "executor.after_receipt", "executor-crm")
    assert report.unknowns == 0
    _assert_zeros(report)


def test_kill_relay_after_produce_before_the_lsn_flush(chaos: Pipeline) -> None:
    report = _run(chaos, "relay.after_produce", "relay")
    assert report.unknowns == 0  # republished exec records are deduped by the ledger
    _assert_zeros(report)


def test_kill_relay_after_its_sweep_before_the_lsn_flush(chaos: Pipeline) -> None:
    # Issue 41: acknowledged rows are swept in batches, on a timer or a row count. Killed
    # between the DELETE's commit and the slot's confirmation, the next session streams the
    # same transactions again: their rows are gone, so it publishes duplicates (the same event
    # ids), finds nothing left to sweep, and confirms past them.
    report = _run(chaos, "relay.after_sweep", "relay")
    assert report.unknowns == 0  # republished exec records are deduped by the ledger
    _assert_zeros(report)


def test_kill_relay_right_after_it_creates_its_slot(chaos: Pipeline) -> None:
    # Issue 18: commands admitted while no slot exists predate the one the relay creates; a
    # relay killed right after creating it used to take their only copy (its snapshot) with
    # it. Each round: the slot is dropped, a note is admitted, the relay creates the slot and
    # dies. The clean relay at the end streams nothing of them: the backstop must find them.
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    report = harness.PointReport("relay.after_slot_created")
    relay = chaos.services["relay"]
    slot = relay.env["AGENTLEDGER_RELAY_SLOT"]
    ops: dict[uuid.UUID, str] = {}
    for _ in range(harness.KILLS):
        relay.kill()
        testing_ledger.drop_slot(chaos.database_url, slot)
        op = harness.note(chaos, ops)()
        assert wait_until(lambda op=op: op in harness.states(chaos, [op]), timeout=60), (
            "the note was never admitted")
        harness.restart(chaos, "relay", "relay.after_slot_created:kill:1")
        harness.wait_killed(chaos, "relay")
        report.kills += 1
    harness.restart(chaos, "relay", None)
    assert harness.settle(chaos, ops), harness.unsettled(chaos, ops)
    log = relay.log.read_text(errors="replace")
    assert "event=relay.backstop reason=stale" in log, relay.tail()  # who published them
    report.seconds = time.monotonic() - started
    report = harness.check(chaos, report, ops, baseline)
    assert report.unknowns == 0
    _assert_zeros(report)
