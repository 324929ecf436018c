"""Real Debezium and our relay publish the same outbox rows as the same Kafka records.

Kafka Connect 4.1.1 (the brokers' version) with the Debezium PostgreSQL connector and its
Outbox Event Router, configured by deploy/debezium/outbox-connector.json, streams one fresh
database; ``python -m agentledger.services.relay`` streams another holding the very same
rows. Both connect as the same kind of login (REPLICATION, member of agentledger_relay), each
with its own slot and topic namespace. The records must agree on topic (modulo namespace),
partition, key, value bytes, per-key order and headers — except where the README documents
a difference, which is asserted as such so it cannot drift silently.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from agentledger.testing import ledger
from agentledger.testing.polling import wait_until
from tests import stack as stack_mod
from tests.deploy import conftest as deploy_conftest
from tests.deploy import connect
from tests.integration.relay import support

ROOT = Path(__file__).resolve().parents[2]
CONNECTOR_JSON = ROOT / "deploy" / "debezium" / "outbox-connector.json"
CONNECTORS = ("crm", "billing", "shipping")
# As topic.creation.exec.partitions in the connector config: equal partition counts are
# what makes "same key, same partition" comparable.
EXEC_PARTITIONS = 6
BEFORE_START = 12   # rows committed before the slots exist: both snapshot them
AFTER_START = 48    # rows streamed from the WAL
# A rich payload: nesting, unicode, a decimal and a null — jsonb's text rendering must
# reach Kafka byte for byte through both paths.
PAYLOAD_EXTRA = {"note": "café ☕ \"quoted\"", "amount": 12.50, "nested": {"b": [1, 2], "a": None}}

# The only connector settings a deployment changes; everything else is used as committed.
ENVIRONMENT_KEYS = frozenset({
    "database.hostname", "database.port", "database.dbname", "database.user",
    "database.password", "slot.name", "topic.prefix",
    "predicates.isCommandOutbox.pattern", "predicates.isEventOutbox.pattern",
})
# Only because tests share one cluster: every topic name gets the run's namespace.
NAMESPACE_KEYS = frozenset({
    "transforms.commands.route.topic.replacement", "transforms.auditTopic.replacement",
    "transforms.outcomeTopic.replacement", "topic.creation.exec.include",
})

pytestmark = [
    # The first run fetches ~80 jars from Maven Central inside the session fixture; the
    # comparison itself takes well under a minute.
    pytest.mark.timeout(900),
]


def _report(request: pytest.FixtureRequest, line: str) -> None:
    deploy_conftest.TIMINGS.append(f"[debezium] {line}")


@pytest.fixture(scope="session")
def connect_home(request: pytest.FixtureRequest) -> Path:
    start = time.monotonic()
    home = connect.fetch(ROOT / ".local" / "connect")
    _report(request, f"Kafka Connect + Debezium jars ready in {connect.elapsed(start)}")
    return home


@dataclass(frozen=True)
class Login:
    name: str
    password: str


@pytest.fixture
def relay_login(stack: stack_mod.Stack) -> Iterator[Login]:
    """A LOGIN with REPLICATION, member of agentledger_relay: what production gives both.

    REPLICATION is a role attribute and is not inherited through membership, so the login
    carries it itself; grants and the outbox RLS policies come from agentledger_relay.
    """
    login = Login(f"dbz_test_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex)
    conn = psycopg2.connect(stack.database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE ROLE "{login.name}" LOGIN REPLICATION PASSWORD %s'
                        f" IN ROLE agentledger_relay", (login.password,))
        yield login
        with conn.cursor() as cur:
            cur.execute(f'DROP ROLE IF EXISTS "{login.name}"')
    finally:
        conn.close()


def _as(url: str, login: Login) -> str:
    parts = urlsplit(url)
    netloc = f"{login.name}:{login.password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def connector_config(*, database_url: str, login: Login, slot: str, prefix: str,
                     namespace: str) -> dict[str, Any]:
    """deploy/debezium/outbox-connector.json, pointed at one database and topic namespace."""
    spec = json.loads(CONNECTOR_JSON.read_text())
    base: dict[str, str] = spec["config"]
    url = urlsplit(database_url)
    env = {
        "database.hostname": url.hostname, "database.port": str(url.port),
        "database.dbname": url.path.lstrip("/"), "database.user": login.name,
        "database.password": login.password, "slot.name": slot, "topic.prefix": prefix,
        # The raw topics are <topic.prefix>.public.<table>; the committed patterns say
        # agentledger, the committed prefix.
        "predicates.isCommandOutbox.pattern": re.escape(prefix) + r"\.public\.command_outbox",
        "predicates.isEventOutbox.pattern": re.escape(prefix) + r"\.public\.event_outbox",
    }
    assert base["topic.prefix"] == "agentledger"
    assert base["predicates.isCommandOutbox.pattern"] == r"agentledger\.public\.command_outbox"
    ns = {
        "transforms.commands.route.topic.replacement":
            namespace + base["transforms.commands.route.topic.replacement"],
        "transforms.auditTopic.replacement": namespace + base["transforms.auditTopic.replacement"],
        "transforms.outcomeTopic.replacement":
            namespace + base["transforms.outcomeTopic.replacement"],
        "topic.creation.exec.include":
            re.escape(namespace) + base["topic.creation.exec.include"],
    }
    assert set(env) == ENVIRONMENT_KEYS and set(ns) == NAMESPACE_KEYS
    assert int(base["topic.creation.exec.partitions"]) == EXEC_PARTITIONS
    return {"name": f"outbox-{prefix}", "config": {**base, **env, **ns}}


# ------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Event:
    id: uuid.UUID
    tenant: uuid.UUID
    kind: str  # audit | outcome
    seq: int
    traceparent: str | None
    tracestate: str | None


# Written by hand, unlike the relay tests (agentledger.testing.ledger): the comparison needs
# the same rows, ids included, in two databases, and admission's statements let the database
# choose the outbox ids. Columns as admission writes them (ledger/queries.sql admit_command).
_ADMIT_COMMAND = """
INSERT INTO agent_command (tenant_id, operation_id, request_hash, state, principal_id, action,
  connector, resource_id, decision_id, policy_version, allowlist_version, expires_at,
  payload_ciphertext, payload_key_version)
VALUES (%(tenant)s, %(op)s, %(hash)s, 'pending', 'user-1', %(action)s, %(connector)s, 'res-1',
  %(decision)s, 'p1', 'a1', now() + interval '1 hour', %(cipher)s, 1)
"""
_COMMAND_OUTBOX = """
INSERT INTO command_outbox (tenant_id, operation_id, id, aggregatetype, aggregateid, type,
  payload, traceparent, tracestate)
VALUES (%(tenant)s, %(op)s, %(id)s, %(connector)s, %(key)s, 'command.admitted',
  jsonb_build_object('tenant_id', %(tenant)s::uuid, 'operation_id', %(op)s::uuid,
                     'type', 'command.admitted'),
  %(traceparent)s, %(tracestate)s)
"""
# The payload carries more shapes than admission's events.
_EVENT = """
INSERT INTO event_outbox (id, tenant_id, operation_id, aggregatetype, aggregateid, type,
  payload, traceparent, tracestate)
VALUES (%(id)s, %(tenant)s, NULL, %(kind)s, %(tenant)s::text, %(type)s,
  json_build_object('tenant_id', %(tenant)s::text, 'seq', %(seq)s)::jsonb || %(extra)s::jsonb,
  %(traceparent)s, %(tracestate)s)
"""


def make_rows(count: int, tenants: list[uuid.UUID], start: int
              ) -> list[list[ledger.Command | Event]]:
    """Transactions of commands and events; NULL and non-NULL trace columns mixed."""
    batches: list[list[ledger.Command | Event]] = []
    for first in range(start, start + count, 6):
        batch: list[ledger.Command | Event] = []
        for i in range(first, min(first + 6, start + count)):
            tenant = tenants[i % len(tenants)]
            batch.append(replace(ledger.new_command(tenant, CONNECTORS[i % len(CONNECTORS)],
                                                    tracestate="al=1" if i % 2 else None),
                                 event_id=uuid.uuid4()))
            batch.append(Event(uuid.uuid4(), tenant, "audit", i,
                               None if i % 5 == 0 else ledger.traceparent(),
                               "vendor=x" if i % 3 == 0 else None))
        batch.append(Event(uuid.uuid4(), tenants[0], "outcome", first, ledger.traceparent(),
                           None))
        batches.append(batch)
    return batches


def insert(database_url: str, batches: list[list[ledger.Command | Event]]) -> None:
    conn = psycopg2.connect(database_url)
    try:
        for batch in batches:
            with conn, conn.cursor() as cur:  # one transaction per batch
                for row in batch:
                    if isinstance(row, ledger.Command):
                        cur.execute(_ADMIT_COMMAND, {
                            "tenant": str(row.tenant), "op": str(row.operation),
                            "hash": hashlib.sha256(row.key.encode()).digest(),
                            "action": f"{row.connector}.note.create", "connector": row.connector,
                            "decision": str(uuid.uuid4()), "cipher": b"\x00" * 16})
                        cur.execute(_COMMAND_OUTBOX, {
                            "tenant": str(row.tenant), "op": str(row.operation),
                            "id": str(row.event_id), "connector": row.connector, "key": row.key,
                            "traceparent": row.traceparent, "tracestate": row.tracestate})
                    else:
                        cur.execute(_EVENT, {
                            "id": str(row.id), "tenant": str(row.tenant), "kind": row.kind,
                            "type": f"{row.kind}.recorded", "seq": row.seq,
                            "extra": json.dumps(PAYLOAD_EXTRA), "traceparent": row.traceparent,
                            "tracestate": row.tracestate,
                        })
    finally:
        conn.close()


def expected_topics(batches: list[list[ledger.Command | Event]]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for batch in batches:
        for row in batch:
            if isinstance(row, ledger.Command):
                counts[f"exec.{row.connector}.v1"] += 1
            else:
                counts[{"audit": "audit.events.v1", "outcome": "agent.outcomes.v1"}[row.kind]] += 1
    return dict(counts)


# ---------------------------------------------------------------------------- records
def high_watermarks(bootstrap: str, topics: list[str]) -> int:
    """Records in the topics (all fresh): catches a duplicate the reader stopped before."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex}"})
    try:
        metadata = consumer.list_topics(timeout=10)
        total = 0
        for t in topics:
            for p in metadata.topics[t].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()


def collect(bootstrap: str, admin: AdminClient, namespace: str, topics: dict[str, int],
            timeout: float) -> list[support.Received]:
    names = [namespace + t for t in topics]
    support.wait_for_topics(admin, names, timeout=timeout)
    want = sum(topics.values())
    records = support.read_topics(bootstrap, names, lambda got: len(got) >= want,
                                  timeout=timeout)
    assert len(records) == want, (
        f"read {len(records)} of {want} records under {namespace}; the topics hold "
        f"{high_watermarks(bootstrap, names)}")
    return records


def by_topic_and_key(records: list[support.Received], namespace: str
                     ) -> dict[tuple[str, str], list[support.Received]]:
    """Records per (topic without namespace, key), in partition order."""
    grouped: dict[tuple[str, str], list[support.Received]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        assert r.topic.startswith(namespace)
        grouped[(r.topic[len(namespace):], r.key)].append(r)
    return grouped


# ------------------------------------------------------------------------------- test
def test_debezium_outbox_router_publishes_what_the_relay_publishes(
    request: pytest.FixtureRequest,
    connect_home: Path,
    stack: stack_mod.Stack,
    make_database: Callable[[], str],
    kafka_admin: AdminClient,
    relay_login: Login,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:10]
    relay_db, debezium_db = make_database(), make_database()
    tenants = [uuid.uuid4() for _ in range(4)]
    early = make_rows(BEFORE_START, tenants, 0)
    late = make_rows(AFTER_START, tenants, BEFORE_START)
    topics = expected_topics(early + late)
    assert set(topics) == {*(f"exec.{c}.v1" for c in CONNECTORS), "audit.events.v1",
                           "agent.outcomes.v1"}

    relay = support.Relay(
        database_url=_as(relay_db, relay_login), bootstrap=stack.kafka_bootstrap,
        slot=f"relay_eq_{tag}", namespace=f"rl{tag}.", log_dir=tmp_path,
        extra_env={"AGENTLEDGER_RELAY_EXEC_PARTITIONS": str(EXEC_PARTITIONS)},
        service_login=False,  # already the relay's dedicated login
    )
    prefix, dbz_ns, dbz_slot = f"dbz{tag}", f"dz{tag}.", f"debezium_eq_{tag}"
    worker = connect.Worker(connect_home, stack.kafka_bootstrap, tmp_path)
    spec = connector_config(database_url=debezium_db, login=relay_login, slot=dbz_slot,
                            prefix=prefix, namespace=dbz_ns)
    try:
        # Rows that predate both slots: the relay's exported snapshot and Debezium's
        # snapshot.mode=initial must both publish them.
        insert(relay_db, early)
        insert(debezium_db, early)
        started = time.monotonic()
        worker.start(spec)
        relay.start()
        status = worker.wait_running(spec["name"], timeout=120)
        _report(request, f"Connect worker + connector RUNNING in {connect.elapsed(started)}"
                         f" (worker {status['tasks'][0]['worker_id']})")
        insert(relay_db, late)
        insert(debezium_db, late)

        streamed = time.monotonic()
        ours = collect(stack.kafka_bootstrap, kafka_admin, relay.namespace, topics, timeout=90)
        theirs = collect(stack.kafka_bootstrap, kafka_admin, dbz_ns, topics, timeout=90)
        _report(request, f"{len(ours)} records from each, both read in "
                         f"{connect.elapsed(streamed)}")
        names = list(topics)
        assert high_watermarks(stack.kafka_bootstrap, [relay.namespace + t for t in names]) \
            == len(ours), "the relay published duplicates"
        assert high_watermarks(stack.kafka_bootstrap, [dbz_ns + t for t in names]) \
            == len(theirs), "Debezium published duplicates"

        mine, other = by_topic_and_key(ours, relay.namespace), by_topic_and_key(theirs, dbz_ns)
        assert mine.keys() == other.keys()  # same topics modulo namespace, same keys
        for where, relay_records in mine.items():
            debezium_records = other[where]
            # Same events in the same order per key: ids identify them.
            assert [r.header("id") for r in relay_records] == \
                   [r.header("id") for r in debezium_records], where
            for ours_r, theirs_r in zip(relay_records, debezium_records, strict=True):
                assert ours_r.partition == theirs_r.partition, where  # murmur2 on both sides
                assert ours_r.value == theirs_r.value, where  # jsonb text, byte for byte
                # Documented difference: Debezium sends a NULL column as a header with a
                # null value where the relay omits it; our consumers (handling.headers_of)
                # drop null-valued headers, so both read as "absent".
                present = [(k, v) for k, v in theirs_r.headers if v is not None]
                nulls = {k for k, v in theirs_r.headers if v is None}
                # Documented difference: the relay adds where the row came from in the WAL
                # (`xid`, `commit_lsn`; issue 18; not on pre-slot snapshot rows); consumers treat
                # both as optional.
                ours_h = [(k, v) for k, v in ours_r.headers if k not in ("xid", "commit_lsn")]
                assert present == ours_h, where
                assert nulls <= {"traceparent", "tracestate"}, where
                assert nulls.isdisjoint(k for k, _ in ours_r.headers), where
        assert any(None in dict(r.headers).values() for r in theirs), "no NULL column covered"

        # Documented difference: the relay sweeps what Kafka confirmed; Debezium never deletes.
        assert wait_until(lambda: ledger.outbox_count(relay_db) == 0, timeout=30), \
            relay.log_text()[-3000:]
        assert ledger.outbox_count(debezium_db) == len(ours)
    finally:
        stopped = time.monotonic()
        code = worker.stop()
        for proc in relay.procs:
            if proc.poll() is None:
                relay.terminate(proc)
        relay.kill_all()
        _report(request, f"Connect stopped (exit {code}) in {connect.elapsed(stopped)}")
        ledger.drop_slot(relay_db, relay.slot)
        ledger.drop_slot(debezium_db, dbz_slot)
        ledger.delete_namespace_topics(kafka_admin, relay.namespace)
        ledger.delete_namespace_topics(kafka_admin, dbz_ns)
        # Heartbeats go to __debezium-heartbeat.<topic.prefix>, outside the namespace.
        ledger.delete_namespace_topics(kafka_admin, f"__debezium-heartbeat.{prefix}")
