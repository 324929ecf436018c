"""A worker paused between its pre-call check and the send, or between the provider's answer
and its record (issue 37), with real processes: the billing executor stops itself (SIGSTOP at
a fault point), its lease runs out, the reconciler takes the refund over and records
``unknown``, an operator resolves it with `agentledger reconcile resolve`, then the worker
resumes (SIGCONT).

- A provider that fences: the take-over and the resolution advanced its fence, so the late
  request is refused (``Fenced``), recorded on its attempt; the ledger's ``failed`` is true.
- A provider that can neither fence nor refuse a late request (the same CRM, its billing
  connector configured ``fencing: false, deadline: false`` for the executor, the reconciler
  and the operator alike): the resolution is recorded provisional, the late refund lands,
  and the ledger says so — contradicted, audited, counted — never `failed` + an effect +
  silence.
- Paused after the answer: the late ``applied`` settles the ``unknown`` refund.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import pytest

from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness

REFUND = "billing.refund.create"
# Lease (4 s) + call bound (2 s) + margin and a reconciler period, on a loaded 2-core box.
UNKNOWN_S = 120.0
# An operator's resolution is refused while a sent attempt may still act (MAX_CALL_S, 30 s,
# after its send): the operator tries again, as they would, until it is taken.
RESOLVE_S = 120.0


def _rows(p: Pipeline, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg2.connect(p.database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _refunds(p: Pipeline) -> int:
    return len([e for e in asyncio.run(p.crm.effects(p.tenant)) if e["kind"] == "refund.created"])


def _events(p: Pipeline, op: uuid.UUID, kind: str) -> list[dict[str, Any]]:
    return [r[0] for r in _rows(p, "SELECT payload FROM audit_event WHERE operation_id = %s "
                                   "AND type = %s ORDER BY seq", str(op), kind)]


def _resolve_failed(p: Pipeline, op: uuid.UUID, connectors: dict[str, Any] | None) -> None:
    """`agentledger reconcile resolve … --outcome failed` as the operator, tried again while
    the ledger says an attempt may still act; any other refusal fails the test."""
    asyncio.run(identities.put_principals(p.database_url, p.tenant,
                                          {identities.OPERATOR: ["agent-operator"]}))
    env = {**os.environ, **identities.operator_env(
        p.database_url, p.crm.url, {c: {p.tenant: p.tokens["lookup"]} for c in ("crm", "billing")}),
        "AGENTLEDGER_TOKEN": identities.session_token(p.tenant, identities.OPERATOR)}
    if connectors is not None:
        env["AGENTLEDGER_CONNECTORS"] = json.dumps(connectors)
    argv = [sys.executable, "-m", "agentledger.cli", "reconcile", "resolve", str(op),
            "--tenant", p.tenant, "--outcome", "failed", "--reason",
            "finance found no refund at the provider"]
    tried: list[str] = []

    def taken() -> bool:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        if done.returncode == 0:
            return True
        tried.append(done.stdout + done.stderr)
        assert "attempt_may_still_act" in tried[-1], tried[-1]
        return False
    assert wait_until(taken, timeout=RESOLVE_S, interval=2), tried[-1:]


@contextmanager
def _paused_refund(p: Pipeline, point: str) -> Iterator[tuple[uuid.UUID, int]]:
    """The billing executor armed to stop itself at ``point``, a refund it claims, it
    stopped there; resumed and restarted clean on exit."""
    svc = p.services["executor-billing"]
    harness.restart(p, "executor-billing", f"{point}:pause:1")
    assert svc.proc is not None
    pid = svc.proc.pid
    try:
        op = p.propose(REFUND, {"invoice_id": f"inv-{uuid.uuid4().hex[:6]}",
                                "amount_minor": 4200, "currency": "EUR", "reason": "stall"})
        assert wait_until(lambda: p.pending_approval(op), timeout=60)
        p.approve(op)
        assert wait_until(lambda: harness.stopped(pid), timeout=90), (
            f"the billing executor never paused at {point}; {op} is {p.state(op)}\n{svc.tail()}")
        yield op, pid
    finally:
        if harness.stopped(pid):
            os.kill(pid, signal.SIGCONT)  # a stopped process ignores SIGTERM until resumed
        harness.restart(p, "executor-billing", None)


def _late_answer(p: Pipeline, op: uuid.UUID) -> str | None:
    found = _rows(p, "SELECT late_answer FROM command_attempt WHERE operation_id = %s AND "
                     "fencing_generation = 1", str(op))
    return found[0][0] if found else None


@contextmanager
def _billing(p: Pipeline, **offers: bool) -> Iterator[dict[str, Any]]:
    """The deployment's billing provider offering ``offers`` (``fencing``, ``deadline``): the
    executor, the reconciler and (through the returned connectors) the operator know it."""
    options = {"crm": {"url": p.crm.url}, "billing": {"url": p.crm.url, **offers}}
    names = ("executor-billing", "reconciler")
    for name in names:
        p.services[name].env["AGENTLEDGER_CONNECTORS"] = json.dumps(options)
        harness.restart(p, name, None)
    try:
        yield options
    finally:
        for name in names:
            p.services[name].env.pop("AGENTLEDGER_CONNECTORS", None)
            harness.restart(p, name, None)


@pytest.mark.parametrize(("offers", "refused_as"), [
    ({"fencing": True, "deadline": False}, "fenced"),  # the fence alone refuses it
    ({"fencing": False, "deadline": True}, "not_sent"),  # its deadline alone does
], ids=["fence", "deadline"])
def test_a_provider_refuses_the_call_of_a_worker_paused_before_it(
        chaos: Pipeline, offers: dict[str, bool], refused_as: str) -> None:
    started, before = time.monotonic(), _refunds(chaos)
    with _billing(chaos, **offers) as options, _paused_refund(
            chaos, "executor.before_call") as (op, pid):
        chaos.wait_state(op, "unknown", timeout=UNKNOWN_S)
        fences = [e["fencing_generation"] for e in _events(chaos, op, "command.fence_advanced")]
        assert fences == ([2] if offers["fencing"] else [])
        _resolve_failed(chaos, op, options)
        assert chaos.state(op) == ("failed", None)
        # Fenced, or every sent attempt's deadline passed: no late call can land.
        assert _rows(chaos, "SELECT provisional FROM command_resolution WHERE "
                            "operation_id = %s", str(op)) == [(False,)]
        os.kill(pid, signal.SIGCONT)  # its request leaves now, under generation 1
        assert wait_until(lambda: _late_answer(chaos, op) is not None, timeout=60), (
            chaos.services["executor-billing"].tail())
    assert _late_answer(chaos, op) == refused_as  # refused by the provider, recorded
    assert _refunds(chaos) == before  # no refund
    assert _rows(chaos, "SELECT state, contradicted_at FROM agent_command WHERE "
                        "operation_id = %s", str(op)) == [("failed", None)]
    report = harness.PointReport(
        f"executor.before_call (SIGSTOP, billing, refused by its {refused_as.split('_')[0]})",
        kills=1, commands=1, seconds=time.monotonic() - started)
    report.notes.append(f"the late refund was refused by the provider ({refused_as}); failed "
                        "holds, not provisional")
    harness.save(report)


def test_a_provider_that_cannot_fence_has_the_late_refund_recorded_and_flagged(
        chaos: Pipeline) -> None:
    started, before = time.monotonic(), _refunds(chaos)
    with _billing(chaos, fencing=False, deadline=False) as options:
        with _paused_refund(chaos, "executor.before_call") as (op, pid):
            chaos.wait_state(op, "unknown", timeout=UNKNOWN_S)
            assert _events(chaos, op, "command.fence_advanced") == []
            _resolve_failed(chaos, op, options)
            assert _rows(chaos, "SELECT provisional FROM command_resolution WHERE "
                                "operation_id = %s", str(op)) == [(True,)]
            os.kill(pid, signal.SIGCONT)  # the late refund lands
            assert wait_until(lambda: _rows(
                chaos, "SELECT 1 FROM agent_command WHERE operation_id = %s AND "
                       "contradicted_at IS NOT NULL", str(op)) != [], timeout=60), (
                chaos.services["executor-billing"].tail())
            log = chaos.services["executor-billing"].log.read_text(errors="replace")
            assert f"event=contradicted operation_id={op}" in log
    assert _refunds(chaos) == before + 1
    assert chaos.state(op) == ("failed", None)  # what was resolved stays, flagged
    (contradicted,) = _events(chaos, op, "command.contradicted")
    assert contradicted["state"] == "failed" and contradicted["provider_receipt"]
    report = harness.PointReport("executor.before_call (SIGSTOP, billing, cannot fence)",
                                 kills=1, commands=1, effects=1,
                                 seconds=time.monotonic() - started)
    report.notes.append("late refund landed after a provisional `failed`: recorded "
                        "contradicted (audit, metric, log), 0 silent")
    harness.save(report)


def test_a_late_applied_answer_settles_the_refund_of_a_worker_paused_after_it(
        chaos: Pipeline) -> None:
    started, before = time.monotonic(), _refunds(chaos)
    with _paused_refund(chaos, "executor.after_remote_write") as (op, pid):
        chaos.wait_state(op, "unknown", timeout=UNKNOWN_S)
        os.kill(pid, signal.SIGCONT)  # the answer it held is recorded now
        state = chaos.wait_state(op, "succeeded", timeout=60)
    assert state[1] is not None and state[1].startswith("crm:refund:")
    assert _refunds(chaos) == before + 1
    (settled,) = _events(chaos, op, "command.succeeded")
    assert settled["settled_by"] == "late_answer"
    report = harness.PointReport("executor.after_remote_write (SIGSTOP, billing)", kills=1,
                                 commands=1, effects=1, seconds=time.monotonic() - started)
    report.notes.append("unknown, then settled by the late applied answer")
    harness.save(report)
