"""Outbox rows that no stream will ever carry are published from the table (issue 18).

Rows committed before the slot existed used to live only in the memory of the session that
created it: if that session died before publishing them, or another process created the
slot, nothing ever published them (0 of 5 in the reproduction). The backstop scan finds them
in the outbox, where they stay until Kafka acknowledged them.
"""

from __future__ import annotations

import uuid

import psycopg2
from confluent_kafka.admin import AdminClient

from agentledger.testing import kafka_read, ledger
from agentledger.testing.polling import wait_until
from tests.integration.relay import support

ROWS = 5
# Admission writes two outbox rows per command: its exec obligation and its audit event.
OUTBOX_ROWS = 2 * ROWS
# Scan quickly in these tests; production waits far longer than the normal relay latency.
QUICK = {"AGENTLEDGER_RELAY_BACKSTOP_AGE": "1", "AGENTLEDGER_RELAY_BACKSTOP_INTERVAL": "0.5"}


def _admit(url: str, n: int) -> list[ledger.Command]:
    writer = ledger.Ledger(url)
    try:
        with writer.transaction():
            return [writer.admit(ledger.new_command(uuid.uuid4(), ledger.CONNECTORS[i % 3]))
                    for i in range(n)]
    finally:
        writer.close()


def _sql(url: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def _published(relay: support.Relay, kafka_admin: AdminClient,
               commands: list[ledger.Command]) -> dict[str, list[support.Received]]:
    topics = sorted({f"{relay.namespace}exec.{c.connector}.v1" for c in commands})
    support.wait_for_topics(kafka_admin, topics)
    wanted = {c.key for c in commands}
    records = support.read_topics(relay.bootstrap, topics,
                                  lambda got: wanted <= {r.key for r in got}, timeout=60)
    by_key: dict[str, list[support.Received]] = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    return by_key


def _assert_all_published_and_swept(relay: support.Relay, kafka_admin: AdminClient,
                                     commands: list[ledger.Command]) -> None:
    by_key = _published(relay, kafka_admin, commands)
    missing = [c.key for c in commands if c.key not in by_key]
    assert not missing, (f"{len(missing)} of {len(commands)} pre-slot rows never published",
                         relay.log_text()[-3000:])
    for c in commands:
        assert {r.header("id") for r in by_key[c.key]} == {str(c.event_id)}
    assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=30), (
        relay.log_text()[-3000:])


def test_rows_before_a_slot_another_session_created_are_published(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    # The reproduction: the slot exists (its creator died before publishing what predates
    # it), so the relay never sees these rows in the WAL it streams.
    commands = _admit(relay.database_url, ROWS)
    _sql(relay.database_url, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
         relay.slot)
    proc = relay.start(**QUICK)
    _assert_all_published_and_swept(relay, kafka_admin, commands)
    assert f"event=relay.backstop reason=stale rows={OUTBOX_ROWS}" in relay.log_text()
    assert relay.terminate(proc) == 0


def test_a_relay_killed_right_after_creating_its_slot_loses_nothing(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    commands = _admit(relay.database_url, ROWS)
    first = relay.start(AGENTLEDGER_FAULT="relay.after_slot_created:kill:1", **QUICK)
    assert first.wait(timeout=60) == -9, relay.log_text()[-3000:]
    assert _sql(relay.database_url, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                relay.slot), "the fault point fires after the slot exists"
    assert ledger.outbox_count(relay.database_url) == OUTBOX_ROWS
    proc = relay.start(**QUICK)
    _assert_all_published_and_swept(relay, kafka_admin, commands)
    assert relay.terminate(proc) == 0


def test_a_row_the_slot_moved_past_is_published_from_the_outbox(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    # A slot confirmed past a committed row (a race, a bug, a slot re-created after a
    # failover): the stream will never carry it, the table still holds it.
    proc = relay.start(**QUICK)
    assert wait_until(lambda: bool(_sql(
        relay.database_url, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
        relay.slot)), timeout=60), relay.log_text()[-3000:]
    assert relay.terminate(proc) == 0
    commands = _admit(relay.database_url, ROWS)
    _sql(relay.database_url, "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
         relay.slot)
    proc = relay.start(**QUICK)
    _assert_all_published_and_swept(relay, kafka_admin, commands)
    assert f"event=relay.backstop reason=stale rows={OUTBOX_ROWS}" in relay.log_text()
    assert relay.terminate(proc) == 0


def test_a_healthy_relay_publishes_each_row_once_with_the_backstop_scanning(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    # The backstop skips what the stream carries: with it scanning every half second at a
    # one-second age, an uninterrupted session still publishes every row exactly once.
    proc = relay.start(AGENTLEDGER_RELAY_TRACE_ACKS="true", **QUICK)
    assert wait_until(lambda: bool(_sql(
        relay.database_url, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
        relay.slot)), timeout=60), relay.log_text()[-3000:]
    commands = [c for _ in range(20) for c in _admit(relay.database_url, 10)]
    assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=30)
    by_key = _published(relay, kafka_admin, commands)
    assert relay.terminate(proc) == 0
    log = relay.log_text()
    # Positive marker before the absence: the stop reports how many scans ran meanwhile.
    passes = [int(w.split("=")[1]) for w in log.split() if w.startswith("backstop_passes=")]
    assert passes and passes[-1] >= 1, log[-3000:]
    missing = [c for c in commands if c.key not in by_key]
    if missing:
        # A recurrence of the lost record (docs/operations.md) names its mechanism: what is
        # at the offset Kafka acknowledged for each missing key, and a second, full read.
        topics = sorted({f"{relay.namespace}exec.{c.connector}.v1" for c in commands})
        again = {(m.key() or b"").decode() for m in kafka_read.read_to_end(relay.bootstrap, topics)}
        verdicts = support.explain_misses(relay.bootstrap, log, [c.key for c in missing])
        raise AssertionError(
            f"{len(missing)} of {len(commands)} rows not read from their topics: "
            f"{[(c.key, c.connector, str(c.event_id)) for c in missing]}; verdicts: {verdicts};"
            f" found by a full re-read: {[c.key for c in missing if c.key in again]}\n"
            + log[-6000:])
    for c in commands:  # every copy is the same event
        assert {r.header("id") for r in by_key[c.key]} == {str(c.event_id)}, log[-3000:]
    if "event=relay.session_failed" in log:
        # At-least-once: a failed session replays from the slot, and its copies are allowed.
        # (Here, about 1 run in 50: Kafka acknowledged the first record of a new partition
        # without an offset, which the relay refuses: it was the lost record.)
        assert log.count("event=relay.streaming") >= 2, log[-3000:]
        return
    assert log.count("event=relay.streaming") == 1, log[-3000:]  # one uninterrupted session
    assert all(len(by_key[c.key]) == 1 for c in commands), log[-3000:]
    assert "event=relay.backstop " not in log, log[-3000:]

