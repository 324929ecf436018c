"""Committed outbox rows reach their topics, keyed, ordered per key, with their headers."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

from confluent_kafka.admin import AdminClient

from agentledger.testing import ledger
from agentledger.testing.polling import wait_until
from tests.integration.relay import support

COMMANDS = 1000
TENANTS = 20
PER_TRANSACTION = 10


def test_1000_commands_reach_exec_topics_in_commit_order_per_key(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    tenants = [uuid.uuid4() for _ in range(TENANTS)]
    commands: list[ledger.Command] = []
    audit_ids: dict[uuid.UUID, list[str]] = defaultdict(list)  # tenant -> ids in commit order
    writer = ledger.Ledger(relay.database_url)
    proc = None
    try:
        for start in range(0, COMMANDS, PER_TRANSACTION):
            if start == 5 * PER_TRANSACTION:
                # The first rows predate the slot: the relay's initial snapshot publishes them.
                proc = relay.start()
            with writer.transaction():  # one transaction per batch
                for i in range(start, start + PER_TRANSACTION):
                    tenant = tenants[i % TENANTS]
                    command = writer.admit(ledger.new_command(
                        tenant, ledger.CONNECTORS[i % 3], tracestate="al=1" if i % 2 else None
                    ))
                    commands.append(command)
                    # Several events per key (tenant), across commits: per-key order check.
                    # Admission audits each command first (command.admitted), then ours.
                    audit_ids[tenant].append(str(command.audit_id))
                    event_id = writer.add_event(tenant, "audit", seq=i)
                    audit_ids[tenant].append(str(event_id))
                if start % 100 == 0:
                    writer.add_event(tenants[0], "outcome", seq=start)
    finally:
        writer.close()

    ns = relay.namespace
    exec_topics = [f"{ns}exec.{c}.v1" for c in ledger.CONNECTORS]
    audit_topic, outcome_topic = f"{ns}audit.events.v1", f"{ns}agent.outcomes.v1"
    support.wait_for_topics(kafka_admin, [*exec_topics, audit_topic, outcome_topic])
    # Per command: its exec record, admission's audit event and ours; plus the outcomes.
    wanted = 3 * COMMANDS + COMMANDS // 100
    received = support.read_topics(
        relay.bootstrap, [*exec_topics, audit_topic, outcome_topic],
        lambda got: len(_first_copies(got)) >= wanted, timeout=90,
    )
    records = _first_copies(received)
    assert len(records) == wanted, (len(records), relay.log_text()[-3000:])
    # The relay is at-least-once: a session that failed (a stall on a loaded box, a broker
    # hiccup) replays from the slot. One uninterrupted session publishes each row once.
    log = relay.log_text()
    if "event=relay.session_failed" not in log:
        assert len(received) == len(records), (len(received) - len(records), "copies", log[-3000:])

    # Exec topics: every command once, on its connector's topic, with its headers.
    by_key = {c.key: c for c in commands}
    exec_records = [r for r in records if r.topic in exec_topics]
    assert sorted(r.key for r in exec_records) == sorted(by_key)
    for r in exec_records:
        command = by_key[r.key]
        assert r.topic == f"{ns}exec.{command.connector}.v1"
        assert r.header("id") == str(command.event_id)
        assert r.header("type") == "command.admitted"
        assert r.header("traceparent") == command.traceparent
        if command.tracestate:
            assert r.header("tracestate") == command.tracestate
        else:
            assert all(name != "tracestate" for name, _ in r.headers)
        assert json.loads(r.value) == {
            "tenant_id": str(command.tenant), "operation_id": str(command.operation),
            "type": "command.admitted",
        }
    assert {r.partition for r in exec_records} == {0, 1, 2, 3}  # the configured 4 partitions

    # Audit topic: each key on exactly one partition, in commit order.
    audit = [r for r in records if r.topic == audit_topic]
    partitions: dict[str, set[int]] = defaultdict(set)
    seen: dict[str, list[str]] = defaultdict(list)
    for r in sorted(audit, key=lambda r: (r.partition, r.offset)):
        partitions[r.key].add(r.partition)
        seen[r.key].append(r.header("id"))
    assert all(len(p) == 1 for p in partitions.values())
    assert {uuid.UUID(k): v for k, v in seen.items()} == audit_ids
    outcomes = [r for r in records if r.topic == outcome_topic]
    assert [json.loads(r.value)["seq"] for r in outcomes] == list(range(0, COMMANDS, 100))

    # Published rows are swept, then the relay stops cleanly on SIGTERM.
    assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=30)
    assert proc is not None and relay.terminate(proc) == 0


def test_relay_refuses_to_start_without_its_slot(relay: support.Relay) -> None:
    proc = relay.start(AGENTLEDGER_RELAY_CREATE_SLOT="false")
    assert proc.wait(timeout=30) == 2
    log = relay.log_text()
    assert "relay_slot_missing" in log and relay.slot in log


def _first_copies(records: list[support.Received]) -> list[support.Received]:
    """Each outbox row once (its ``id`` header per topic): the first copy in partition order."""
    seen: set[tuple[str, str]] = set()
    first = []
    for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        if (r.topic, r.header("id")) not in seen:
            seen.add((r.topic, r.header("id")))
            first.append(r)
    return first
