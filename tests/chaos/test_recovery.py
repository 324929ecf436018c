"""Recovery paths under faults: the reconciler killed mid-lookup, a paused worker past its
lease, consumer-group rebalances mid-dispatch, and a broker restart (on a private stack)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

import psycopg2
import pytest

from agentledger.testing import processes
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.private_stack import PrivateStack


def test_kill_the_reconciler_mid_lookup(chaos: Pipeline) -> None:
    # Every executor kill after its remote write leaves an expired lease on a claim that may
    # have reached the CRM; the reconciler must then look the key up, and is killed there; a
    # later reconciler takes over again. (A kill right after the claim no longer needs a
    # lookup: nothing was stamped as sent, so it is simply requeued.)
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    report = harness.PointReport("reconciler.mid_lookup")
    ops: dict[uuid.UUID, str] = {}
    for _ in range(harness.KILLS):
        harness.restart(chaos, "executor-crm", "executor.after_remote_write:kill:1")
        harness.restart(chaos, "reconciler", "reconciler.mid_lookup:kill:1")
        harness.note(chaos, ops)()
        harness.wait_killed(chaos, "executor-crm")
        harness.wait_killed(chaos, "reconciler")
        report.kills += 1
    harness.restart(chaos, "reconciler", None)
    harness.restart(chaos, "executor-crm", None)
    assert harness.settle(chaos, ops), harness.unsettled(chaos, ops)
    report.seconds = time.monotonic() - started
    harness.check(chaos, report, ops, baseline)
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.unknowns) == (0, 0, 0, 0, 0), report


@contextlib.contextmanager
def _stalled_worker_and_successor(
    chaos: Pipeline, point: str, b_log: str
) -> Iterator[tuple[processes.Service, processes.Service, int, dict[uuid.UUID, str], uuid.UUID]]:
    """Worker A armed to stop itself (SIGSTOP) at ``point``, a note it claims, A stopped
    there, then worker B started in the same group; A is resumed and B stopped on exit.

    B joins only once A has paused: while the note is on its way A is the group's only
    member, so A claims it whichever partition it lands on (never a race for the partition).
    """
    a = chaos.services["executor-crm"]
    harness.restart(chaos, "executor-crm", f"{point}:pause:1")
    b_env = {**a.env, "AGENTLEDGER_EXECUTOR_GROUP_INSTANCE_ID": "executor-crm-1"}
    b_env.pop("AGENTLEDGER_FAULT", None)
    b = processes.Service(a.module, b_env, a.log.with_name(b_log))
    assert a.proc is not None
    pid = a.proc.pid
    try:
        ops: dict[uuid.UUID, str] = {}
        op = harness.note(chaos, ops)()
        assert wait_until(lambda: harness.stopped(pid), timeout=60), (
            f"worker A never paused; {op} is {chaos.state(op)}\n"
            f"{harness.describe_group(chaos, 'executor-crm')}\n--- A\n{a.tail()}")
        b.start()
        yield a, b, pid, ops, op
    finally:
        if harness.stopped(pid):
            os.kill(pid, signal.SIGCONT)  # a stopped process ignores SIGTERM until resumed
        b.stop()
        harness.restart(chaos, "executor-crm", None)


def test_a_paused_worker_past_its_lease_cannot_finalize(chaos: Pipeline, tmp_path: object) -> None:
    # Worker A stops itself (SIGSTOP) right after claiming; its lease expires; the reconciler
    # takes over and requeues; worker B (same group) dispatches. Then A resumes: its pre-call
    # check on the ledger finds the claim gone, so it never calls and is fenced out.
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    with _stalled_worker_and_successor(chaos, "executor.after_claim", "executor-crm-b.log") as (
            a, b, pid, ops, op):
        state = chaos.wait_state(op, "succeeded", timeout=90)
        assert state[0] == "succeeded"
        os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: "event=fenced_out" in a.log.read_text(), timeout=60), (
            f"A resumed but was never fenced out\n--- A\n{a.tail()}\n--- B\n{b.tail()}")
        report = harness.check(chaos, harness.PointReport("stale holder (SIGSTOP/SIGCONT)",
                                                          seconds=time.monotonic() - started),
                               ops, baseline)
        report.kills = 1
        harness.save(report)
        assert (report.effects, report.duplicate_effects) == (1, 0), report
        assert chaos.state(op) == state  # A's late answer changed nothing


def test_a_worker_paused_after_its_pre_call_check_is_refused_by_the_crm(chaos: Pipeline) -> None:
    # Issue 18 §1: worker A passes its pre-call check, then stops (SIGSTOP at
    # executor.before_call) before its request leaves: no check on the ledger can stop it
    # any more. Its lease (4 s, renewed to cover the 2 s call bound) runs out, and the
    # reconciler waits a connector call bound more (a stalled holder may still send), then
    # advances the CRM's fence to its own generation (issue 37), looks the key up, finds
    # nothing and requeues; worker B writes the note under a newer generation. When A
    # resumes, its request reaches the CRM with the old generation, past its deadline: the
    # CRM refuses it (408 deadline_passed, or 409 stale_fencing_token) — the storage rejects
    # the stale writer — and A records the refusal on its attempt (issue 37 §3).
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    with _stalled_worker_and_successor(chaos, "executor.before_call",
                                       "executor-crm-b-fenced.log") as (a, _b, pid, ops, op):
        state = chaos.wait_state(op, "succeeded", timeout=90)
        os.kill(pid, signal.SIGCONT)

        def stale() -> list[tuple[str, str, str]]:
            with psycopg2.connect(chaos.database_url) as conn, conn.cursor() as cur:
                cur.execute("SELECT a.result, a.late_answer, a.detail FROM command_attempt a "
                            "JOIN agent_command c USING (tenant_id, operation_id) "
                            "WHERE a.operation_id = %s AND a.late_answer IS NOT NULL "
                            "AND a.fencing_generation < c.fencing_generation", (str(op),))
                return list(cur.fetchall())
        assert wait_until(lambda: stale() != [], timeout=60), (
            f"A's refused call was never recorded\n--- A\n{a.tail()}")
        report = harness.check(chaos, harness.PointReport(
            "executor.before_call (SIGSTOP, refused by the CRM)",
            seconds=time.monotonic() - started), ops, baseline)
        report.kills = 1
        harness.save(report)
        assert (report.effects, report.duplicate_effects, report.unknowns) == (1, 0, 0), report
        assert chaos.state(op) == state  # A's refused call changed nothing
        ((result, answer, detail),) = stale()
        assert (result, answer) in (("fenced", "fenced"), ("late", "not_sent")), stale()
        assert "stale_fencing_token" in detail or "deadline" in detail, detail


def test_a_restarted_worker_recovers_its_predecessors_claims_without_waiting_the_lease(
        chaos: Pipeline) -> None:
    # Issue 18 §4: a killed executor restarting under the same identity (static membership)
    # waited out its predecessor's whole lease before the claim was recovered. Here the lease
    # is production's 60 s; the restarted worker ends its predecessor's leases at start-up and
    # the reconciler recovers the command at once.
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    svc = chaos.services["executor-crm"]
    svc.env["AGENTLEDGER_EXECUTOR_LEASE_S"] = "60"
    try:
        harness.restart(chaos, "executor-crm", "executor.after_claim:kill:1")
        ops: dict[uuid.UUID, str] = {}
        op = harness.note(chaos, ops)()
        harness.wait_killed(chaos, "executor-crm")
        lease_until = _lease_until(chaos, op)
        assert lease_until is not None, chaos.state(op)
        harness.restart(chaos, "executor-crm", None)
        assert chaos.wait_state(op, "succeeded", timeout=120)[0] == "succeeded"
        finished = _finished_at(chaos, op)
        # Recovered while the predecessor's lease still had time to run: not waited out.
        assert finished < lease_until, (finished, lease_until)
        assert "event=predecessor_claims_released worker_id=executor-crm-executor-crm-0 count=1" \
            in svc.log.read_text(errors="replace"), svc.tail()
        report = harness.check(chaos, harness.PointReport(
            "restart under the same identity", seconds=time.monotonic() - started), ops, baseline)
        report.kills = 1
        report.notes.append(f"recovered {(lease_until - finished).total_seconds():.1f} s before the 60 s lease ran out")
        harness.save(report)
        assert (report.effects, report.duplicate_effects, report.unknowns) == (1, 0, 0), report
    finally:
        svc.env["AGENTLEDGER_EXECUTOR_LEASE_S"] = harness.CHAOS_ENV["executor-crm"]["AGENTLEDGER_EXECUTOR_LEASE_S"]
        harness.restart(chaos, "executor-crm", None)


def _lease_until(p: Pipeline, op: uuid.UUID) -> datetime | None:
    with psycopg2.connect(p.database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT lease_until FROM agent_command WHERE operation_id = %s AND state = 'dispatching'",
                    (str(op),))
        row = cur.fetchone()
    return row[0] if row else None


def _finished_at(p: Pipeline, op: uuid.UUID) -> datetime:
    with psycopg2.connect(p.database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT finished_at FROM agent_command WHERE operation_id = %s", (str(op),))
        row = cur.fetchone()
    assert row is not None and row[0] is not None
    return row[0]


def test_rebalance_mid_dispatch_loses_nothing_and_duplicates_nothing(chaos: Pipeline) -> None:
    # A slow provider keeps calls in flight while executors join and leave the group.
    started, baseline = time.monotonic(), harness.effect_baseline(chaos)
    asyncio.run(chaos.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/customers/"},
                               "action": "delay", "delay_ms": 300, "times": 1000}))
    a = chaos.services["executor-crm"]
    extra: list[processes.Service] = []
    ops: dict[uuid.UUID, str] = {}
    try:
        submit = harness.note(chaos, ops)
        for _ in range(10):
            submit()
        for i in range(2):  # two executors join mid-dispatch...
            env = {**a.env, "AGENTLEDGER_EXECUTOR_GROUP_INSTANCE_ID": f"executor-crm-x{i}"}
            env.pop("AGENTLEDGER_FAULT", None)
            svc = processes.Service(a.module, env, a.log.with_name(f"executor-crm-x{i}.log"))
            svc.start()
            extra.append(svc)
            for _ in range(10):
                submit()
        extra[0].stop()  # ...one leaves gracefully (drains its calls)...
        for _ in range(10):
            submit()
        extra[1].kill()  # ...and one dies mid-call
        for _ in range(10):
            submit()
        assert harness.settle(chaos, ops, timeout=180), harness.unsettled(chaos, ops)
    finally:
        for svc in extra:
            svc.stop()
        asyncio.run(chaos.crm.disarm())
    report = harness.check(chaos, harness.PointReport("rebalance (join, leave, die)",
                                                      seconds=time.monotonic() - started),
                           ops, baseline)
    report.kills = 1
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.unknowns) == (0, 0, 0, 0), report
    assert report.effects == len(ops)


def test_broker_restart_mid_dispatch_loses_nothing(
    private_stack: PrivateStack, make_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The whole pipeline on a private broker and database, so the restart disturbs no one else.
    import psycopg2

    def fresh(url: str) -> str:
        name = f"al_chaos_{uuid.uuid4().hex[:10]}"
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return url.rsplit("/", 1)[0] + "/" + name

    from agentledger import migrations, settings
    ledger_url = fresh(private_stack.database_url)
    asyncio.run(migrations.migrate(ledger_url, settings.REPO_ROOT / "migrations"))
    with pipeline(private_stack.bootstrap, ledger_url, fresh(private_stack.database_url),
                  tmp_path_factory.mktemp("broker"), env=harness.CHAOS_ENV) as p:
        started, baseline = time.monotonic(), harness.effect_baseline(p)
        ops: dict[uuid.UUID, str] = {}
        submit = harness.note(p, ops)
        for _ in range(10):
            submit()
        private_stack.run("kafka", "stop")
        private_stack.run("kafka", "start")
        for _ in range(10):
            submit()
        assert harness.settle(p, ops, timeout=180), harness.unsettled(p, ops)
        report = harness.check(p, harness.PointReport("broker restart",
                                                      seconds=time.monotonic() - started),
                               ops, baseline)
        report.kills = 1
        harness.save(report)
        assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
                report.unknowns) == (0, 0, 0, 0), report
        assert report.effects == len(ops)
