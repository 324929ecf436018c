"""Helpers of the relay tests: admit rows, run the relay as a process, read the topics."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from agentledger import logins
from tests.helpers import wait_until

CONNECTORS = ("crm", "billing", "shipping")


def traceparent() -> str:
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"


@dataclass(frozen=True)
class Command:
    """One admitted command and the ids of the outbox rows written with it."""

    tenant: uuid.UUID
    operation: uuid.UUID
    connector: str
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    traceparent: str = field(default_factory=traceparent)
    tracestate: str | None = None

    @property
    def key(self) -> str:
        return f"{self.tenant}:{self.operation}"


def new_command(tenant: uuid.UUID, connector: str, tracestate: str | None = None) -> Command:
    return Command(tenant, uuid.uuid4(), connector, tracestate=tracestate)


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
  json_build_object('tenant_id', %(tenant)s::text, 'operation_id', %(op)s::text,
                    'type', 'command.admitted'),
  %(traceparent)s, %(tracestate)s)
"""
_EVENT_OUTBOX = """
INSERT INTO event_outbox (id, tenant_id, operation_id, aggregatetype, aggregateid, type,
  payload, traceparent)
VALUES (%(id)s, %(tenant)s, %(op)s, %(kind)s, %(tenant)s::text, %(type)s,
  json_build_object('tenant_id', %(tenant)s::text, 'seq', %(seq)s), %(traceparent)s)
"""


def admit(cur: Any, command: Command) -> None:
    """Insert the ledger row and its dispatch obligation (in the caller's transaction)."""
    params = {
        "tenant": str(command.tenant),
        "op": str(command.operation),
        "hash": hashlib.sha256(command.key.encode()).digest(),
        "action": f"{command.connector}.note.create",
        "connector": command.connector,
        "decision": str(uuid.uuid4()),
        "cipher": b"\x00" * 16,
        "id": str(command.event_id),
        "key": command.key,
        "traceparent": command.traceparent,
        "tracestate": command.tracestate,
    }
    cur.execute(_ADMIT_COMMAND, params)
    cur.execute(_COMMAND_OUTBOX, params)


def add_event(cur: Any, tenant: uuid.UUID, kind: str, seq: int) -> uuid.UUID:
    """Insert one audit/outcome event carrying a sequence number; returns its id."""
    event_id = uuid.uuid4()
    cur.execute(_EVENT_OUTBOX, {
        "id": str(event_id), "tenant": str(tenant), "op": None, "kind": kind,
        "type": f"{kind}.recorded", "seq": seq, "traceparent": traceparent(),
    })
    return event_id


def outbox_count(url: str) -> int:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (SELECT count(*) FROM command_outbox)"
                        " + (SELECT count(*) FROM event_outbox)")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def drop_slot(url: str, slot: str) -> None:
    """Drop the test's slot once no process streams from it."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            def inactive() -> bool:
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                row = cur.fetchone()
                return row is None or not row[0]

            assert wait_until(inactive, timeout=30), f"slot {slot} still active"
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s", (slot,))
    finally:
        conn.close()


@dataclass
class Relay:
    """Runs ``python -m agentledger.services.relay`` against one database and namespace."""

    database_url: str
    bootstrap: str
    slot: str
    namespace: str
    log_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Log in as the relay's own role, derived from the owner's URL (False: the URL already
    # names a dedicated login, as the Debezium equivalence test's does).
    service_login: bool = True

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        environ = {
            **os.environ,
            # The relay's own login, as in production (issue 17): REPLICATION, its group role.
            "AGENTLEDGER_DATABASE_URL": (asyncio.run(logins.ensure(self.database_url, ("relay",)))["relay"]
                                         if self.service_login else self.database_url),
            "AGENTLEDGER_KAFKA_BOOTSTRAP": self.bootstrap,
            "AGENTLEDGER_RELAY_SLOT": self.slot,
            "AGENTLEDGER_RELAY_TOPIC_NAMESPACE": self.namespace,
            "AGENTLEDGER_RELAY_EXEC_PARTITIONS": "4",
            # Tests restart things on purpose; come back quickly.
            "AGENTLEDGER_RELAY_BACKOFF_MAX": "1",
            "AGENTLEDGER_RELAY_SHUTDOWN_TIMEOUT": "5",
            "PYTHONFAULTHANDLER": "1",
            **self.extra_env,
            **env,
        }
        log = (self.log_dir / f"relay-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentledger.services.relay"],
            env=environ, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in sorted(self.log_dir.glob("relay-*.log")))

    def terminate(self, proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@dataclass(frozen=True)
class Received:
    topic: str
    partition: int
    offset: int
    key: str
    value: bytes
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str:
        values = [v for k, v in self.headers if k == name]
        assert len(values) == 1, f"{len(values)} {name!r} headers"
        return values[0].decode()


def wait_for_topics(admin: AdminClient, topics: Iterable[str], timeout: float = 60) -> None:
    wanted = set(topics)
    assert wait_until(lambda: wanted <= set(admin.list_topics(timeout=5).topics), timeout=timeout), (
        f"topics never created: {wanted - set(admin.list_topics(timeout=5).topics)}"
    )


def read_topics(
    bootstrap: str,
    topics: Sequence[str],
    done: Callable[[list[Received]], bool],
    *,
    timeout: float,
) -> list[Received]:
    """Read the topics from the beginning until ``done(records)`` or the deadline."""
    import time

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"relay-test-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
    })
    try:
        metadata = consumer.list_topics(timeout=10)
        consumer.assign([
            TopicPartition(t, p, OFFSET_BEGINNING)
            for t in topics for p in metadata.topics[t].partitions
        ])
        records: list[Received] = []
        deadline = time.monotonic() + timeout
        while not done(records) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error():  # never skipped: a reader that drops errors hides losses
                    raise AssertionError(f"consumer error: {msg.error()}")
                records.append(Received(
                    msg.topic(), msg.partition(), msg.offset(),
                    (msg.key() or b"").decode(), msg.value() or b"",
                    list(msg.headers() or []),
                ))
        return records
    finally:
        consumer.close()


def delete_namespace_topics(admin: AdminClient, namespace: str) -> None:
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(namespace)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=30)


def acknowledged_at(log_text: str) -> dict[str, list[tuple[str, int, int]]]:
    """Where Kafka said each record went, by key, from ``event=relay.acked`` lines (the relay
    logs them with ``AGENTLEDGER_RELAY_TRACE_ACKS=true``)."""
    places: dict[str, list[tuple[str, int, int]]] = {}
    for line in log_text.splitlines():
        if "event=relay.acked " not in line:
            continue
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        # offset=None: Kafka reported the write persisted without an offset (an idempotent
        # retry the broker recognised as a duplicate of one it already has): -1 here.
        places.setdefault(fields["key"], []).append(
            (fields["topic"], int(fields["partition"]),
             -1 if fields["offset"] == "None" else int(fields["offset"])))
    return places


def explain_misses(bootstrap: str, log_text: str, missing: Iterable[str]) -> dict[str, str]:
    """For each key missing from its topic, what is at the offset Kafka acknowledged for it:
    another record (a false acknowledgement), nothing (truncation), or the record itself (the
    reader missed it) — so a loss that never reproduces still explains itself (issue 18)."""
    acked = acknowledged_at(log_text)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"miss-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    verdicts: dict[str, str] = {}
    try:
        for key in sorted(missing):
            places = acked.get(key)
            if not places:
                verdicts[key] = "never acknowledged to the relay (yet swept from the outbox?)"
                continue
            found = []
            for topic, partition, offset in places:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                           timeout=10)
                where = f"{topic}[{partition}]@{offset}"
                if offset < 0:
                    found.append(f"{topic}[{partition}]: acknowledged as a duplicate, offset "
                                 "unknown")
                    continue
                if offset >= high:
                    found.append(f"{where}: past the end ({high}): the log was truncated")
                    continue
                if offset < low:
                    found.append(f"{where}: before the start ({low}): deleted")
                    continue
                consumer.assign([TopicPartition(topic, partition, offset)])
                got = consumer.consume(1, timeout=10)
                if not got or got[0].error() is not None or got[0].offset() != offset:
                    found.append(f"{where}: unreadable ({got[0].error() if got else 'nothing'})")
                elif (got[0].key() or b"").decode() == key:
                    found.append(f"{where}: there: the reader missed it")
                else:
                    found.append(f"{where}: holds {(got[0].key() or b'').decode()!r}: "
                                 "a false acknowledgement")
            verdicts[key] = "; ".join(found)
    finally:
        consumer.close()
    return verdicts
