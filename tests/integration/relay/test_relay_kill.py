"""SIGKILL the relay at random moments while commands are admitted: nothing is lost."""

from __future__ import annotations

import random
import signal
import threading
import uuid
from collections import Counter, defaultdict

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient

from agentledger.testing import ledger
from agentledger.testing.polling import wait_until
from tests.integration.relay import support

KILLS = 10


class Admitter(threading.Thread):
    """Admits one command (+ one audit event) per transaction until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="admitter", daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.committed: list[ledger.Command] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        tenants = [uuid.uuid4() for _ in range(8)]
        writer = ledger.Ledger(self.url)
        try:
            seq = 0
            while not self.stop.is_set():
                tenant = random.choice(tenants)
                with writer.transaction():
                    command = writer.admit(ledger.new_command(tenant, ledger.CONNECTORS[seq % 3]))
                    writer.add_event(tenant, "audit", seq)
                self.committed.append(command)  # only after COMMIT returned
                seq += 1
                # ~200 commands/s: steady load, and each kill lands mid-stream.
                self.stop.wait(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            writer.close()


def _after_commits(admitter: Admitter, count: int) -> None:
    """Return once ``count`` more commands have committed (the kills' pacing)."""
    floor = len(admitter.committed)
    assert wait_until(lambda: len(admitter.committed) >= floor + count or admitter.error is not None,
                      timeout=30, interval=0.01), "the admitter stopped committing"
    assert admitter.error is None, admitter.error


def _slot_exists(url: str, slot: str) -> bool:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cur.fetchone() is not None
    finally:
        conn.close()


def test_sigkilled_relay_publishes_every_row_at_least_once(
    relay: support.Relay, kafka_admin: AdminClient, record_property: pytest.RecordProperty
) -> None:
    rng = random.Random()
    proc = relay.start()
    assert wait_until(lambda: _slot_exists(relay.database_url, relay.slot), timeout=30)
    admitter = Admitter(relay.database_url)
    admitter.start()
    try:
        for _ in range(KILLS):
            # A random moment (starting up, streaming, sweeping or confirming), counted in
            # commits: 40-300 more (0.2-1.5 s at the admitter's pace) since the last start.
            _after_commits(admitter, rng.randint(40, 300))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc = relay.start()
        _after_commits(admitter, rng.randint(100, 200))  # keep admitting while it runs
    finally:
        admitter.stop.set()
        admitter.join(timeout=30)
    assert admitter.error is None, admitter.error
    commands = admitter.committed
    assert len(commands) > 500

    ns = relay.namespace
    exec_topics = [f"{ns}exec.{c}.v1" for c in ledger.CONNECTORS]
    audit_topic = f"{ns}audit.events.v1"
    support.wait_for_topics(kafka_admin, [*exec_topics, audit_topic])
    expected = {c.key for c in commands}
    assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=60), (
        relay.log_text()[-3000:]
    )
    records = support.read_topics(
        relay.bootstrap, [*exec_topics, audit_topic],
        # Distinct event ids, not records: the kills republish, and duplicates counted as
        # records ended the read before every partition's last events were in (CI, 1952 of
        # 1959 read with the outbox already drained). Two audit events per command:
        # admission's command.admitted and the admitter's own.
        lambda got: expected <= {r.key for r in got}
        and len({r.header("id") for r in got if r.topic == audit_topic}) >= 2 * len(commands),
        timeout=60,
    )
    exec_records = [r for r in records if r.topic in exec_topics]
    audit_records = [r for r in records if r.topic == audit_topic]

    # Every committed command was published at least once...
    assert expected <= {r.key for r in exec_records}
    assert len({r.header("id") for r in audit_records}) == 2 * len(commands)
    # ...and every duplicate is the same event: one id per key, same payload.
    ids_per_key: dict[str, set[str]] = defaultdict(set)
    values_per_id: dict[str, set[bytes]] = defaultdict(set)
    for r in exec_records + audit_records:
        if r.topic in exec_topics:
            ids_per_key[r.key].add(r.header("id"))
        values_per_id[r.header("id")].add(r.value)
    assert all(len(ids) == 1 for ids in ids_per_key.values())
    assert all(len(values) == 1 for values in values_per_id.values())
    by_key = {c.key: str(c.event_id) for c in commands}
    assert all(ids_per_key[k] == {by_key[k]} for k in expected)

    copies = Counter(r.header("id") for r in exec_records + audit_records)
    duplicates = sum(n - 1 for n in copies.values())
    record_property("rows_published", 3 * len(commands))
    record_property("duplicates", duplicates)
    print(f"\nrelay kill test: {3 * len(commands)} rows, {KILLS} SIGKILLs, "
          f"{duplicates} duplicate records ({len([n for n in copies.values() if n > 1])} ids)")
    assert relay.terminate(proc) == 0
