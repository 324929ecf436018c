"""Network partitions, not just kills (issue 19 §3): services run in network namespaces the
test creates (tests/netns.py) and their links are cut silently — every packet dropped, no
RST, no ICMP, as a partition does — while they hold work.

- The CRM's answers are held by its link past the executor's call bound (CI's case): the
  executor must not invent a success; the command is ``unknown`` with a reason until the
  reconciler's lookup finds the effect once the link is back; one effect, no duplicate.
- An executor is cut from Postgres after its claim: its statement fails at the ledger's bounds
  (the transaction's 5 s, then the socket's user timeout: ``repository.bound_silence``), its
  lease expires, the reconciler takes the command over — which fences the holder out of the
  ledger and closes its never-sent attempt as ``abandoned`` — and once the link is back the
  command is sent afresh with the same key: one effect.
- The relay is cut from Kafka with records in flight: after the heal every committed command
  is on its topic, the outbox drains, and nothing was swept without an acknowledgement.

Each case first shows the cut struck traffic (the link's drop counter, the stalled process'
own log or ledger rows) before it asserts that something did not happen. Only namespaces,
veth pairs and loopback service addresses the test created are ever touched.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from agentledger.testing import kafka_read
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests import netns, partition_env
from tests.chaos import harness, traffic
from tests.integration.relay import support as relay_support
from tests.partition_env import attempts, command
from tests.stack import Stack

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None,
    reason="partitions need root, ip netns and tc")

# The CRM holds the request this long before it applies it, under the call bound below: without
# the cut the answer would be in time, so the cut is what makes it late. The hold is also the
# test's time to see the request arrive and cut (no retry on a miss: a miss and an invented
# success look alike from here, so a miss fails the case).
HOLD_MS = 3000
# The executor's call bound in this case (the chaos tier's 2 s leaves no time to cut).
CALL_BOUND_S = "4"


@pytest.fixture(scope="module")
def hub(stack: Stack) -> Iterator[partition_env.Hub]:
    with partition_env.hub(stack.database_url) as h:
        yield h


@pytest.fixture(scope="module")
def broker(hub: partition_env.Hub) -> Iterator[str]:
    """A broker namespaces reach, shared by the module's cases and stopped only after them:
    a client still alive when its broker is gone can hang for ever in librdkafka's destroy
    (see agentledger/testing/pipeline.py, ``_delete_topics``)."""
    with partition_env.private_broker(hub.svc) as bootstrap:
        yield bootstrap


def _state(p: Pipeline, op: uuid.UUID) -> str:
    return str(command(p.database_url, op).get("state", ""))


def _clean(report: harness.PointReport) -> None:
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.missing_dead_letters) == (0, 0, 0, 0, 0), report
    assert report.effects == report.commands, report  # one note at the CRM per command


def test_crm_answers_held_past_the_call_bound(
        stack: Stack, hub: partition_env.Hub, make_database: Callable[[], str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    started = time.monotonic()
    crm_db = make_database()
    with ExitStack() as stack_:
        ns = stack_.enter_context(netns.Namespace(f"crm{uuid.uuid4().hex[:5]}", extra=("db",)))
        ns.route(hub.pg, "db")  # its own database stays reachable: only the answers are held
        p = stack_.enter_context(pipeline(
            stack.kafka_bootstrap, make_database(), partition_env.via(crm_db, hub.pg),
            tmp_path_factory.mktemp("partition-crm"), env={**harness.CHAOS_ENV, "executor-crm": {
                **harness.CHAOS_ENV["executor-crm"],
                "AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S": CALL_BOUND_S}},
            crm_options={"prefix": ns.argv([]), "url_host": ns.ns_ip, "host": ns.ns_ip}))
        baseline = harness.effect_baseline(p)
        report = harness.PointReport("partition.crm_answers_held", kills=1)
        asyncio.run(p.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/customers/"},
                               "action": "delay", "delay_ms": HOLD_MS, "times": 1}))
        since = p.crm.log_path.stat().st_size
        op = p.propose("crm.note.create", {"body": "held answer"})
        ops = {op: "note"}
        assert wait_until(lambda: "event=fault_fired action=delay" in
                          partition_env.log_since(p.crm.log_path, since), timeout=90), \
            p.services["executor-crm"].tail()
        # The request is inside the CRM: from now on everything it sends is dropped.
        ns.cut(inbound=False)
        assert wait_until(lambda: _state(p, op) in ("unknown", "succeeded"), timeout=60), \
            harness.unsettled(p, ops)
        during = command(p.database_url, op)
        # No answer came back, so no success may be recorded (`dispatching`: a lookup already).
        assert during["state"] in ("unknown", "dispatching"), (during, attempts(p.database_url, op))
        # The fault struck: the CRM applied the note, its answer never came, packets dropped.
        assert wait_until(lambda: partition_env.crm_effects(crm_db, op) == 1, timeout=30)
        assert ns.dropped() > 0
        assert during["outcome_reason"], during  # `unknown` with its reason
        # The reconciler asked the CRM during the cut, and could not conclude either.
        assert wait_until(lambda: any(a["kind"] == "lookup" and a["result"] == "unknown"
                                      for a in attempts(p.database_url, op)), timeout=60), \
            attempts(p.database_url, op)
        # Nothing invented while nobody could know (`dispatching`: a lookup under way).
        assert _state(p, op) in ("unknown", "dispatching"), command(p.database_url, op)
        dropped = ns.dropped()
        ns.heal()
        # Back: the lookup finds the effect the late answer was about.
        assert wait_until(lambda: _state(p, op) == "succeeded", timeout=90), \
            attempts(p.database_url, op)
        assert harness.settle(p, ops), harness.unsettled(p, ops)
        harness.check(p, report, ops, baseline)
        tried = attempts(p.database_url, op)
        report.unknowns = 0  # every command concluded; the `unknown` above was transient
        report.seconds = time.monotonic() - started
        report.notes += [
            f"request held {HOLD_MS} ms by the CRM (call bound {CALL_BOUND_S} s), its answers "
            "then cut: "
            f"{dropped} packets dropped",
            f"ledger while cut: unknown ({during['outcome_reason']}); after the heal: succeeded "
            "by the reconciler's lookup",
            "attempts: " + ", ".join(f"{a['kind']}/{a['result']}" for a in tried)]
        harness.save(report)
    _clean(report)
    assert [a for a in tried if a["kind"] == "lookup" and a["result"] == "succeeded"], tried


@pytest.mark.chaos_full
def test_executor_cut_from_postgres_after_its_claim(
        broker: str, hub: partition_env.Hub, make_database: Callable[[], str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    started = time.monotonic()
    database_url = make_database()
    with ExitStack() as stack_:
        bootstrap = broker
        ns = stack_.enter_context(netns.Namespace(f"ex{uuid.uuid4().hex[:6]}", extra=("db",)))
        ns.route(hub.pg, "db")  # Postgres over its own link; Kafka and the CRM over `main`
        env = {**harness.CHAOS_ENV, "executor-crm": {
            **harness.CHAOS_ENV["executor-crm"],
            "AGENTLEDGER_DATABASE_URL": partition_env.login_url(database_url, "executor", hub.pg),
            # Stops itself once, right after its first claim committed: the test cuts the
            # link while it holds the claim, then lets it go on.
            "AGENTLEDGER_FAULT": "executor.after_claim:pause:1"}}
        p = stack_.enter_context(pipeline(
            bootstrap, database_url, make_database(), tmp_path_factory.mktemp("partition-ex"),
            env=env, prefix={"executor-crm": ns.argv([])},
            crm_options={"host": hub.svc, "url_host": hub.svc}))
        executor = p.services["executor-crm"]
        assert executor.proc is not None
        pid = executor.proc.pid
        baseline = harness.effect_baseline(p)
        op = p.propose("crm.note.create", {"body": "cut after the claim"})
        ops = {op: "note"}
        assert wait_until(lambda: harness.stopped(pid), timeout=90), executor.tail()
        claim = command(database_url, op)
        assert claim["state"] == "dispatching", claim
        ns.cut("db")
        since = executor.log.stat().st_size
        os.kill(pid, signal.SIGCONT)
        # The fault struck: the holder's next statement went into the silent link, and it gave
        # up at its transaction bound (a ledger transaction is bounded on the client too).
        assert wait_until(lambda: ns.dropped("db") > 0, timeout=30), executor.tail()
        assert wait_until(lambda: any(
            "event=inflight_failed" in line and "StorageError" in line
            for line in partition_env.log_since(executor.log, since).splitlines()),
            timeout=60), executor.tail()
        # Its lease ran out; the reconciler took the command over (a newer generation), which
        # fences the holder out of the ledger (its token is gone) and closes its attempt.
        assert wait_until(lambda: command(database_url, op)["fencing_generation"]
                          > claim["fencing_generation"], timeout=90), attempts(database_url, op)
        stale = next(a for a in attempts(database_url, op)
                     if a["fencing_generation"] == claim["fencing_generation"])
        assert stale["result"] == "abandoned", stale  # closed by the take-over, during the cut
        assert partition_env.crm_effects(p.crm.database_url, op) == 0  # nothing was sent
        gave_up = [line.split(" ERROR ", 1)[-1] for line in
                   partition_env.log_since(executor.log, since).splitlines()
                   if "event=inflight_failed" in line]
        dropped = ns.dropped("db")
        ns.heal("db")
        # Back: the requeued command is dispatched afresh, with the same key.
        assert wait_until(lambda: _state(p, op) == "succeeded", timeout=120), \
            attempts(database_url, op)
        assert harness.settle(p, ops), harness.unsettled(p, ops)
        report = harness.check(p, harness.PointReport("partition.executor_postgres", kills=1),
                               ops, baseline)
        tried = attempts(database_url, op)
        stale = next(a for a in tried if a["fencing_generation"] == claim["fencing_generation"])
        report.seconds = time.monotonic() - started
        report.notes = [
            f"executor held generation {claim['fencing_generation']} when its Postgres link was "
            f"cut ({dropped} packets dropped); the reconciler took over",
            f"the holder's log: {gave_up[:1]}",
            f"stale attempt: {stale['result']} ({stale['detail']})",
            "attempts: " + ", ".join(f"g{a['fencing_generation']} {a['worker_id']} {a['kind']}/"
                                     f"{a['result']}" for a in tried)]
        harness.save(report)
    _clean(report)
    assert stale["result"] == "abandoned" and stale["sent_at"] is None, stale
    assert "taken over" in stale["detail"], stale
    # No attempt of that generation ever reached the CRM; exactly one attempt succeeded.
    assert not [a for a in tried if a["fencing_generation"] == claim["fencing_generation"]
                and a["sent_at"] is not None], tried
    assert len([a for a in tried if a["result"] == "succeeded"]) == 1, tried


@pytest.mark.chaos_full
def test_relay_cut_from_kafka_mid_batch(
        broker: str, hub: partition_env.Hub, make_database: Callable[[], str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    started = time.monotonic()
    database_url = make_database()
    with ExitStack() as stack_:
        bootstrap = broker
        ns = stack_.enter_context(netns.Namespace(f"rl{uuid.uuid4().hex[:6]}", extra=("db",)))
        ns.route(hub.pg, "db")  # Postgres over its own link; Kafka over `main`, which is cut
        env = {**harness.CHAOS_ENV, "relay": {
            "AGENTLEDGER_DATABASE_URL": partition_env.login_url(database_url, "relay", hub.pg),
            "AGENTLEDGER_RELAY_TRACE_ACKS": "true",
            # A stall is declared this long after the last delivery report with records in
            # flight (30 s in production): the cut below outlasts it.
            "AGENTLEDGER_RELAY_STALL_TIMEOUT": "5"}}
        p = stack_.enter_context(pipeline(
            bootstrap, database_url, make_database(), tmp_path_factory.mktemp("partition-rl"),
            env=env, prefix={"relay": ns.argv([])}))
        relay = p.services["relay"]
        baseline = harness.effect_baseline(p)
        ops: dict[uuid.UUID, str] = {}
        with traffic.SteadyLoad(p, ops) as load:
            assert wait_until(lambda: harness.succeeded(p, ops) >= 3, timeout=90), \
                harness.unsettled(p, ops)
            since = relay.log.stat().st_size
            ns.cut()
            cut_mark = load.after()
            # The fault struck: commands admitted meanwhile wait in the outbox, the relay's
            # packets to the broker are dropped, and the relay felt it.
            assert wait_until(lambda: ns.dropped() > 0 and harness.outbox_rows(p) > 0
                              and len(set(ops) - cut_mark) >= 3, timeout=90)
            assert wait_until(lambda: any(
                e in partition_env.log_since(relay.log, since)
                for e in ("event=relay.kafka_error", "event=relay.producer_reset")),
                timeout=120), relay.tail()
            stuck = [o for o in set(ops) - cut_mark if o in harness.states(p, [o])]
            dropped, felt = ns.dropped(), [
                line.split("event=", 1)[1][:80] for line in
                partition_env.log_since(relay.log, since).splitlines()
                if "event=relay.kafka_error" in line or "event=relay.producer_reset" in line]
            ns.heal()
            load.more(load.after())
        assert harness.settle(p, ops), harness.unsettled(p, ops)
        assert wait_until(lambda: harness.outbox_rows(p) == 0, timeout=120), harness.outbox_rows(p)
        assert wait_until(lambda: harness.exec_lag(p) == 0, timeout=120), harness.exec_lag(p)
        # Every committed command reached its topic, and every one swept was acknowledged.
        records = kafka_read.read_to_end(bootstrap, [p.topic("exec.crm.v1")])
        published = {(m.key() or b"").decode() for m in records}
        acked = relay_support.acknowledged_at(relay.log.read_text(errors="replace"))
        unpublished = [o for o in ops if not any(str(o) in k for k in published)]
        unacked = [o for o in ops if not any(str(o) in k for k in acked)]
        report = harness.check(p, harness.PointReport("partition.relay_kafka", kills=1),
                               ops, baseline)
        report.seconds = time.monotonic() - started
        report.notes = [f"relay cut from Kafka with {len(stuck)} commands admitted meanwhile; "
                        f"{dropped} packets dropped", f"relay felt it: {felt[:3]}",
                        f"{len(records)} exec records; unpublished {len(unpublished)}, "
                        f"swept without an acknowledgement {len(unacked)}"]
        harness.save(report)
    assert stuck and felt
    assert unpublished == [] and unacked == [], (unpublished, unacked)
    _clean(report)
    assert report.unknowns == 0, report
