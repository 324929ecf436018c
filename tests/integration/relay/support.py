"""Helpers of the relay tests: a load that survives database restarts, the relay as a
process, reading its topics and explaining a miss. Commands and events are written by
``agentledger.testing.ledger`` (the product's own admission statements)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from agentledger import errors, logins
from agentledger.testing import ledger
from agentledger.testing.polling import wait_until

# What a database restart looks like to the writer: refused or dropped connections, and the
# storage errors the ledger translates them into.
_DATABASE_AWAY = (errors.StorageError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError,
                  TimeoutError)


class ResilientAdmitter(threading.Thread):
    """Admits commands for a few tenants (~150/s by default), reconnecting while the database is away.

    ``paused`` holds it between commits (the lost-record hunt checks each round at rest);
    ``new_round`` switches to fresh tenants so a round's ground truth is its tenants' rows."""

    def __init__(self, url: str, pace_s: float = 0.005) -> None:
        super().__init__(name="admitter", daemon=True)
        self.url, self.pace_s = url, pace_s
        self.tenants = [uuid.uuid4() for _ in range(4)]
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.idle = threading.Event()  # set while paused and between transactions
        self.commits = 0

    def new_round(self) -> None:
        self.tenants = [uuid.uuid4() for _ in range(4)]

    def pause(self, timeout: float = 30) -> None:
        """Hold the admitter between transactions (returns once it holds)."""
        self.paused.set()
        self.idle.clear()
        assert self.idle.wait(timeout), "the admitter did not pause"

    def resume(self) -> None:
        self.paused.clear()

    def run(self) -> None:
        writer: ledger.Ledger | None = None
        seq = 0
        while not self.stop.is_set():
            if self.paused.is_set():
                self.idle.set()
                self.stop.wait(0.05)
                continue
            self.idle.clear()
            try:
                if writer is None:
                    writer = ledger.Ledger(self.url, connect_timeout=2)
                tenant = self.tenants[seq % len(self.tenants)]
                with writer.transaction():
                    writer.admit(ledger.new_command(tenant, ledger.CONNECTORS[seq % 3]))
                    writer.add_event(tenant, "outcome", seq)
                self.commits += 1
                seq += 1
                self.stop.wait(self.pace_s)  # 0.005: ~150 commands/s
            except _DATABASE_AWAY:
                if writer is not None:
                    writer.close()
                writer = None
                self.stop.wait(0.2)  # the database is restarting: back off, then retry
        if writer is not None:
            writer.close()

    def admitted_keys(self) -> set[str]:
        """Ground truth: every command of the current tenants whose transaction committed."""
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT tenant_id::text || ':' || operation_id::text FROM agent_command"
                            " WHERE tenant_id = ANY(%s::uuid[])", ([str(t) for t in self.tenants],))
                return {row[0] for row in cur.fetchall()}
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
