"""The pipeline on a 3-broker cluster (issue 19 §2): leaders, the active controller and two of
three brokers SIGKILLed under steady load; then no loss, no duplicate, no invented success.

Every topic is created by the services themselves with three replicas and
``min.insync.replicas=2`` (AGENTLEDGER_KAFKA_REPLICATION_FACTOR=3); every producer uses
acks=all with idempotence. Each case first shows that its fault really struck (the
partition's leader moved, the quorum elected another controller, a write was refused) and
only then asserts what must not have happened. ``make test`` runs the exec-leader kill; the
other cases run under ``make chaos`` (marker ``chaos_full``, see tests/chaos/conftest.py).
"""

from __future__ import annotations

import gc
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime

import psycopg2
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

from agentledger.kafka import topics as kafka_topics
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness, traffic
from tests.kafka_cluster import BROKERS, CONTROLLERS, SESSION_TIMEOUT_S, KafkaCluster

REPLICAS = 3
SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")
# A fault's effect shows within a few session timeouts (fencing, election, a client's
# metadata refresh); on a loaded 2-core box we allow generously more, as a deadline only.
FAILOVER_S = 8 * SESSION_TIMEOUT_S
# Notes held this long at the CRM keep commands in flight (claimed, not yet answered) at any
# moment of the load, so a kill lands mid-dispatch.
CALL_DELAY_MS = 300
# Admission's customer look-ups held this long make admission slower than the load, so
# proposals wait on their partition and a kill lands mid-admission.
LOOKUP_DELAY_MS = 1000


@pytest.fixture(scope="module")
def cluster_pipeline(kafka_cluster: KafkaCluster, database_url: str,
                     make_database: Callable[[], str],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    # The chaos settings (short leases, a quick reconciler) with production's consumer groups:
    # dynamic membership, default session timeouts. A static member (group.instance.id)
    # whose coordinator is away longer than its session timeout rejoins and is fenced by
    # its own new membership: librdkafka makes that fatal (librdkafka #3437) and FastStream
    # then polls a dead consumer. The fault-point tests restart services and need static
    # membership; these kill brokers, not services, and run what the manifests deploy.
    env = {name: {**{k: v for k, v in harness.CHAOS_ENV.get(name, {}).items()
                     if not k.endswith(("_GROUP_INSTANCE_ID", "_SESSION_TIMEOUT_MS"))},
                  "AGENTLEDGER_KAFKA_REPLICATION_FACTOR": str(REPLICAS)} for name in SERVICES}
    # Every acknowledgement logged with its partition and offset: evidence if a record goes missing.
    env["relay"]["AGENTLEDGER_RELAY_TRACE_ACKS"] = "true"
    with pipeline(kafka_cluster.bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("brokers"), env=env) as p:
        yield p
    # Its readiness probes hold admin clients: destroyed now, while the brokers answer, not at
    # the interpreter's exit, where destroying a client of a vanished cluster hangs the run.
    p.ready.clear()
    gc.collect()


def _topics(p: Pipeline, cluster: KafkaCluster) -> list[str]:
    admin = cluster.admin()
    return sorted(t for t in admin.list_topics(timeout=10).topics if t.startswith(p.ns))


def _healthy(p: Pipeline, cluster: KafkaCluster) -> None:
    """Every node up and every partition of the pipeline's topics fully in sync."""
    cluster.start_all()

    def in_sync() -> bool:
        for topic in _topics(p, cluster):
            found = cluster.partitions(topic)
            if found is None or any(s.isr != BROKERS for s in found.values()):
                return False
        return True
    assert wait_until(in_sync, timeout=FAILOVER_S), {t: cluster.partitions(t) for t in _topics(p, cluster)}


def _new_leader(cluster: KafkaCluster, topic: str, partition: int, old: int) -> int:
    """Positive marker: the controller gave the partition to another broker."""
    assert wait_until(lambda: cluster.leader(topic, partition) not in (None, old), timeout=FAILOVER_S), (
        f"{topic}[{partition}] still led by {old}: {cluster.partition(topic, partition)}")
    leader = cluster.leader(topic, partition)
    assert leader is not None and leader != old
    return leader


def _isr(cluster: KafkaCluster, topic: str, partition: int) -> tuple[int, ...] | None:
    state = cluster.partition(topic, partition)
    return None if state is None else state.isr


def _keys_on(p: Pipeline, topic: str, partition: int) -> set[str]:
    """The operation ids (from the ``tenant:operation`` keys) of every record of one partition
    (none while the partition's leader is not known yet: the caller polls again)."""
    consumer = Consumer({"bootstrap.servers": p.bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        except KafkaException:
            return set()
        consumer.assign([TopicPartition(topic, partition, 0)])
        found: set[str] = set()
        position = 0
        deadline = time.monotonic() + 30
        while position < high and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            position = msg.offset() + 1
            found.add((msg.key() or b"").decode().rsplit(":", 1)[-1])
        return found
    finally:
        consumer.close()


def _ids(ops: set[uuid.UUID]) -> set[str]:
    return {str(o) for o in ops}


def _tenant_partition(p: Pipeline, cluster: KafkaCluster, topic: str) -> int:
    """The one partition the pipeline's tenant key sends ``topic``'s records to."""
    highs: list[int | None] = []

    def answered() -> bool:  # a leader that moved answers once the client's metadata caught up
        highs[:] = [cluster.high_watermark(topic, i) for i in range(3)]
        return None not in highs
    assert wait_until(answered, timeout=FAILOVER_S), highs
    filled = [i for i, high in enumerate(highs) if high]
    assert len(filled) == 1, f"{topic}: records on partitions {filled}, expected the tenant's one"
    return filled[0]


def _query_one(p: Pipeline, sql: str, *args: object) -> object:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone()
    finally:
        conn.close()
    assert row is not None
    return row[0]


def _db_now(p: Pipeline) -> datetime:
    now = _query_one(p, "SELECT now()")
    assert isinstance(now, datetime)
    return now


def _created_since(p: Pipeline, ops: dict[uuid.UUID, str], since: datetime) -> int:
    """Commands of ``ops`` the ledger admitted after ``since``."""
    return int(str(_query_one(p, "SELECT count(*) FROM agent_command WHERE operation_id = "
                                 "ANY(%s::uuid[]) AND created_at > %s", [str(o) for o in ops], since)))


def _in_state(p: Pipeline, ops: dict[uuid.UUID, str], *states: str) -> int:
    return sum(1 for s, _ in harness.states(p, list(ops)).values() if s in states)


def _settle_and_check(p: Pipeline, report: harness.PointReport, ops: dict[uuid.UUID, str],
                      baseline: int, started: float) -> None:
    assert harness.settle(p, ops), harness.unsettled(p, ops)
    report.seconds = time.monotonic() - started
    harness.check(p, report, ops, baseline)
    harness.save(report)
    assert (report.duplicate_effects, report.invented_successes, report.lost_commands,
            report.redispatched_successes, report.unknowns) == (0, 0, 0, 0, 0), report
    assert report.effects == report.commands == len(ops), report


def test_every_topic_the_pipeline_created_has_three_replicas_and_min_isr_two(
        cluster_pipeline: Pipeline, kafka_cluster: KafkaCluster) -> None:
    p, cluster = cluster_pipeline, kafka_cluster
    names = _topics(p, cluster)
    # The services created these at start-up: proposals, admissions, exec and their DLQs.
    assert {p.topic("agent.proposals.v1"), p.topic("agent.admissions.v1"),
            p.topic("exec.crm.v1"), p.topic("exec.billing.v1")} <= set(names), names
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in names]
    admin = cluster.admin()
    configs = {r.name: f.result(timeout=30) for r, f in admin.describe_configs(resources).items()}
    for topic in names:
        partitions = cluster.partitions(topic)
        assert partitions, topic
        assert {s.replicas for s in partitions.values()} == {BROKERS}, (topic, partitions)
        floor = configs[topic]["min.insync.replicas"]
        # Set on the topic itself (not inherited from the broker, whose default may be 1).
        assert (floor.value, floor.source) == ("2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), (
            topic, floor)


def test_kill_the_leader_of_an_exec_partition_mid_relay_and_dispatch(
        cluster_pipeline: Pipeline, kafka_cluster: KafkaCluster) -> None:
    p, cluster = cluster_pipeline, kafka_cluster
    exec_topic = p.topic("exec.crm.v1")
    _healthy(p, cluster)
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport("broker: exec partition leader SIGKILLed")
    ops: dict[uuid.UUID, str] = {}
    victim = None
    try:
        with traffic.CrmDelay(p, "POST", CALL_DELAY_MS), traffic.SteadyLoad(p, ops) as load:
            # Mid-relay and mid-dispatch: commands already succeeded and others are claimed,
            # their calls held at the CRM, when the leader dies.
            assert wait_until(lambda: _in_state(p, ops, "succeeded") >= 3
                              and _in_state(p, ops, "dispatching") >= 1, timeout=90), (
                harness.unsettled(p, ops))
            victim = cluster.leader(exec_topic, 0)
            assert victim in BROKERS
            cluster.kill(victim)
            report.kills = 1
            leader = _new_leader(cluster, exec_topic, 0, victim)
            report.notes.append(f"{exec_topic}[0]: leader {victim} SIGKILLed, {leader} elected")
            # Records keep flowing through the new leader: an operation proposed after the
            # failover is relayed to partition 0 (the load goes on until one is).
            later = load.after()
            assert wait_until(lambda: bool(_keys_on(p, exec_topic, 0) & _ids(set(load.ops) - later)),
                              timeout=harness.SETTLE_S), f"nothing reached {exec_topic}[0] after the failover"
            load.more(later)
        assert not load.errors, load.errors
        report.notes.append(f"{len(ops) - len(later)} proposed after the failover; "
                            f"{load.blocked} proposals held up more than {traffic.BLOCKED_S:.0f} s")
        cluster.start(victim)
        _settle_and_check(p, report, ops, baseline, started)
        # The restarted broker is a follower in sync again.
        assert wait_until(lambda: _isr(cluster, exec_topic, 0) == BROKERS, timeout=FAILOVER_S), (
            cluster.partition(exec_topic, 0))
    finally:
        cluster.start_all()


@pytest.mark.chaos_full
def test_kill_the_leader_of_the_proposals_partition_mid_admission(
        cluster_pipeline: Pipeline, kafka_cluster: KafkaCluster) -> None:
    p, cluster = cluster_pipeline, kafka_cluster
    proposals, admissions = p.topic("agent.proposals.v1"), p.topic("agent.admissions.v1")
    group = p.services["admission"].env["AGENTLEDGER_ADMISSION_GROUP_ID"]
    _healthy(p, cluster)
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport("broker: proposals partition leader SIGKILLed")
    ops: dict[uuid.UUID, str] = {}
    try:
        with traffic.CrmDelay(p, "GET", LOOKUP_DELAY_MS), traffic.SteadyLoad(p, ops) as load:
            assert wait_until(lambda: _in_state(p, ops, "succeeded") >= 3, timeout=90), (
                harness.unsettled(p, ops))
            part = _tenant_partition(p, cluster, proposals)

            def waiting() -> bool:  # proposals on the partition that admission has not committed
                high, done = cluster.high_watermark(proposals, part), cluster.committed(group, proposals, part)
                return high is not None and done is not None and done < high
            # Mid-admission: proposals wait on the partition, admission is working through them.
            assert wait_until(waiting, timeout=90), "admission never fell behind the load"
            victim = cluster.leader(proposals, part)
            assert victim in BROKERS
            backlog_end = cluster.high_watermark(proposals, part)
            assert backlog_end is not None
            # The tenant key puts admission's answers on the same partition number.
            answers_too = cluster.leader(admissions, part) == victim
            cluster.kill(victim)
            report.kills = 1
            leader = _new_leader(cluster, proposals, part, victim)
            report.notes.append(f"{proposals}[{part}]: leader {victim} SIGKILLed with offsets up "
                                f"to {backlog_end} not yet admitted, {leader} elected; the "
                                f"admissions partition had the same leader: {answers_too}")
            later = load.after()
            # Admission goes on from the new leader: it commits past what waited at the kill.
            assert wait_until(lambda: (cluster.committed(group, proposals, part) or -1) > backlog_end,
                              timeout=harness.SETTLE_S), (
                f"admission never committed past offset {backlog_end} of {proposals}[{part}]")
            load.more(later)
        assert not load.errors, load.errors
        report.notes.append(f"{load.blocked} proposals held up more than {traffic.BLOCKED_S:.0f} s")
        cluster.start(victim)
        _settle_and_check(p, report, ops, baseline, started)
    finally:
        cluster.start_all()


@pytest.mark.chaos_full
def test_kill_the_active_controller(cluster_pipeline: Pipeline, kafka_cluster: KafkaCluster) -> None:
    p, cluster = cluster_pipeline, kafka_cluster
    _healthy(p, cluster)
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport("controller: quorum leader SIGKILLed")
    ops: dict[uuid.UUID, str] = {}
    try:
        with traffic.CrmDelay(p, "POST", CALL_DELAY_MS), traffic.SteadyLoad(p, ops) as load:
            assert wait_until(lambda: _in_state(p, ops, "succeeded") >= 3, timeout=90), (
                harness.unsettled(p, ops))
            before = cluster.quorum()
            assert before is not None and before.leader in CONTROLLERS, before
            cluster.kill(before.leader)
            report.kills = 1
            later = load.after()

            def elected() -> bool:
                now = cluster.quorum()
                return now is not None and now.leader in CONTROLLERS and now.leader != before.leader \
                    and now.epoch > before.epoch
            assert wait_until(elected, timeout=FAILOVER_S), (before, cluster.quorum())
            after = cluster.quorum()
            assert after is not None
            report.notes.append(f"controller {before.leader} (epoch {before.epoch}) SIGKILLed; "
                                f"{after.leader} leads at epoch {after.epoch}")
            # The new controller serves metadata writes: a topic the project creates now.
            probe = p.topic("probe.after-controller-failover")
            assert kafka_topics.ensure(p.bootstrap, {probe: 3}, replication=REPLICAS) == [probe]
            assert wait_until(lambda: (found := cluster.partitions(probe)) is not None and all(
                s.leader in BROKERS and s.isr == BROKERS for s in found.values()), timeout=FAILOVER_S), (
                cluster.partitions(probe))
            load.more(later)  # the pipeline went on through the failover
            cluster.start(before.leader)  # returns once it is a caught-up voter again
        _settle_and_check(p, report, ops, baseline, started)
    finally:
        cluster.start_all()


@pytest.mark.chaos_full
def test_losing_two_brokers_stops_writes_and_one_returning_resumes_them(
        cluster_pipeline: Pipeline, kafka_cluster: KafkaCluster) -> None:
    p, cluster = cluster_pipeline, kafka_cluster
    proposals, exec_topic = p.topic("agent.proposals.v1"), p.topic("exec.crm.v1")
    probe = p.topic("probe.min-isr")
    _healthy(p, cluster)
    # A topic only this test writes to, created the way the project creates topics.
    kafka_topics.ensure(p.bootstrap, {probe: 1}, replication=REPLICAS)
    assert wait_until(lambda: _isr(cluster, probe, 0) == BROKERS, timeout=FAILOVER_S)
    started, baseline = time.monotonic(), harness.effect_baseline(p)
    report = harness.PointReport("brokers: two of three SIGKILLed")
    ops: dict[uuid.UUID, str] = {}
    writer = traffic.ProbeWriter(p.bootstrap, probe)
    try:
        # Slow admission: proposals wait on their partition, so the outage finds admission,
        # its answers and the relay's records mid-way, not an idle pipeline.
        with traffic.CrmDelay(p, "GET", LOOKUP_DELAY_MS), traffic.SteadyLoad(p, ops) as load:
            assert wait_until(lambda: _in_state(p, ops, "succeeded") >= 3, timeout=90), (
                harness.unsettled(p, ops))
            part = _tenant_partition(p, cluster, proposals)
            # The proposals leader and an exec leader die; the survivor must take both over.
            first = cluster.leader(proposals, part)
            assert first in BROKERS
            second = next(b for b in (cluster.leader(exec_topic, 0), *BROKERS) if b not in (first, None))
            survivor = next(b for b in BROKERS if b not in (first, second))
            killed_at = _db_now(p)
            cluster.kill(first)
            cluster.kill(second)
            report.kills = 2
            # The controller fences both; the survivor leads with an ISR of itself alone.
            assert wait_until(lambda: (s := cluster.partition(probe, 0)) is not None
                              and s.leader == survivor and s.isr == (survivor,), timeout=FAILOVER_S), (
                cluster.partition(probe, 0))
            # Writes stop: an acks=all write to one in-sync replica of min.insync.replicas=2
            # is refused...
            assert wait_until(lambda: writer.write() == "NOT_ENOUGH_REPLICAS", timeout=FAILOVER_S,
                              interval=1), writer.answers
            # ...and a proposal of the pipeline waits unacknowledged; the probe goes on
            # meanwhile, so its answers cover the outage until a broker returns.
            assert wait_until(lambda: bool(writer.write()) and load.waiting_s() > traffic.BLOCKED_S,
                              timeout=FAILOVER_S, interval=1), load.waiting_s()
            outage = list(writer.answers)
            mark = load.after()
            admitted_meanwhile = _created_since(p, ops, killed_at)
            cluster.start(first)  # one returns
            assert wait_until(lambda: len(_isr(cluster, probe, 0) or ()) >= 2, timeout=FAILOVER_S), (
                cluster.partition(probe, 0))
            resumed = writer.write()
            load.more(mark)  # the held proposal and the next ones are acknowledged
        assert not load.errors, load.errors
        # Never was a write acknowledged with one replica: every answer in the outage a refusal.
        assert "ok" not in outage and "NOT_ENOUGH_REPLICAS" in outage, outage
        assert resumed == "ok", resumed
        assert load.blocked >= 1, "no proposal of the pipeline was held up by the outage"
        report.notes.append(f"survivor {survivor}; probe answers during the outage "
                            f"{dict(Counter(outage))}; {load.blocked} proposals held up more "
                            f"than {traffic.BLOCKED_S:.0f} s, acknowledged once {first} returned; "
                            f"{admitted_meanwhile} commands admitted into the ledger meanwhile")
        # The ledger recovers with two brokers; then the second returns too.
        assert harness.settle(p, ops, timeout=2 * harness.SETTLE_S), harness.unsettled(p, ops)
        cluster.start(second)
        _settle_and_check(p, report, ops, baseline, started)
    finally:
        writer.close()
        cluster.start_all()
