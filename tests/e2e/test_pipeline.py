"""Proposal on Kafka → admission → ledger + outbox → relay → executor → CRM effect → outcome.

Every piece is a real process; assertions are on the ledger, the CRM's effect log and the
records on the topics.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import psycopg2
import pytest

from agentledger import logins
from agentledger.testing import kafka_read
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests import syncrep
from tests.stack import Stack


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("e2e")) as p:
        yield p


def effects(p: Pipeline, kind: str) -> list[dict[str, Any]]:
    return [e for e in asyncio.run(p.crm.effects(p.tenant)) if e["kind"] == kind]


def test_note_flows_through_every_service_once(world: Pipeline) -> None:
    op = world.propose("crm.note.create", {"body": "call back on Monday"})
    _, receipt = world.wait_state(op, "succeeded")
    assert receipt is not None and receipt.startswith("crm:note:")
    notes = [e for e in effects(world, "note.created") if e["idempotency_key"] == str(op)]
    assert len(notes) == 1
    outcomes = world.read("agent.outcomes.v1", lambda v: v.get("operation_id") == str(op))
    assert outcomes[0]["outcome"] == {"state": "succeeded", "receipt": receipt}
    audit = world.read("audit.events.v1", lambda v: v.get("operation_id") == str(op)
                       and v.get("state") == "succeeded")
    assert audit, "the audit topic carries the outcome"


def test_the_same_exec_record_delivered_five_times_makes_one_effect(world: Pipeline) -> None:
    op = world.propose("crm.note.create", {"body": "only once"})
    world.wait_state(op, "succeeded")
    producer = world.producer()
    record = json.dumps({"tenant_id": world.tenant, "operation_id": str(op),
                         "type": "command.admitted"}).encode()
    for _ in range(5):
        producer.produce(world.topic("exec.crm.v1"), key=f"{world.tenant}:{op}".encode(), value=record)
    assert producer.flush(15) == 0
    # The marker that all five were consumed: the executor logged a skip for each of them
    # (all on the partition of their key, after the original delivery).
    log = world.services["executor-crm"].log
    skipped = f"event=exec_skipped operation_id={op} "
    assert wait_until(lambda: log.read_text().count(skipped) >= 5, timeout=60), (
        f"{log.read_text().count(skipped)} of 5 duplicates skipped\n{world.services['executor-crm'].tail()}")
    assert len([e for e in effects(world, "note.created") if e["idempotency_key"] == str(op)]) == 1


def test_refund_with_a_lost_answer_is_unknown_never_success(world: Pipeline) -> None:
    asyncio.run(world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                               "action": "drop_after_commit", "times": 1}))
    op = world.propose("billing.refund.create", {"invoice_id": "inv-1", "amount_minor": 1999,
                                                 "currency": "EUR", "reason": "late delivery"})
    assert wait_until(lambda: world.pending_approval(op), timeout=60)
    world.approve(op)
    state, receipt = world.wait_state(op, "unknown", "succeeded")
    assert (state, receipt) == ("unknown", None)
    assert len(effects(world, "refund.created")) == 1
    # The reconciler keeps it unknown: billing can't be looked up and is never resent. A whole
    # pass run after the unknown was recorded is the marker that it had its chance.
    done = world.sweep_once()
    assert done.get(op, "skipped") == "skipped", done
    assert world.state(op) == ("unknown", None)
    assert len(effects(world, "refund.created")) == 1


def test_poison_exec_record_goes_to_the_dlq_and_does_not_stall(world: Pipeline) -> None:
    producer = world.producer()
    producer.produce(world.topic("exec.crm.v1"), key=b"k", value=b'{"not": "an exec request"}')
    assert producer.flush(15) == 0
    dead = world.read("exec.crm.dlq.v1", lambda v: v.get("error_code") == "poison_message")
    assert dead and dead[0]["source_topic"] == world.topic("exec.crm.v1")
    op = world.propose("crm.note.create", {"body": "after the poison"})
    assert world.wait_state(op, "succeeded")[0] == "succeeded"


def test_the_audit_topic_carries_the_same_events_as_the_audit_ledger(world: Pipeline) -> None:
    from confluent_kafka import Consumer

    op = world.propose("crm.note.create", {"body": "audited"})
    world.wait_state(op, "succeeded")
    conn = psycopg2.connect(world.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT event_id::text, type FROM audit_event WHERE operation_id = %s", (str(op),))
            ledger = dict(cur.fetchall())
    finally:
        conn.close()
    assert set(ledger.values()) >= {"command.admitted", "command.claimed", "command.succeeded"}
    consumer = Consumer({"bootstrap.servers": world.bootstrap, "group.id": f"audit-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([world.topic("audit.events.v1")])
    topic: dict[str, str] = {}

    def poll() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            headers = {k: v.decode() for k, v in (msg.headers() or []) if v is not None}
            if json.loads(msg.value()).get("operation_id") == str(op):
                topic[headers["id"]] = headers["type"]
        return topic == ledger
    try:
        assert wait_until(poll, timeout=60, interval=0), (topic, ledger)
    finally:
        consumer.close()


def test_every_service_logs_in_as_its_own_role_and_reset_role_gains_nothing(world: Pipeline) -> None:
    # Issue 17 §7: the stack used to connect every service as the owner (a superuser) and
    # SET ROLE — no boundary, since RESET ROLE gives the superuser back. Each service now
    # logs in as its own role, as the Kubernetes secrets prescribe.
    world.wait_state(world.propose("crm.note.create", {"body": "who am I"}), "succeeded", timeout=60)

    async def sessions() -> dict[str, Any]:
        conn = await asyncpg.connect(world.database_url)
        try:
            rows = await conn.fetch(
                "SELECT a.usename, r.rolsuper, r.rolbypassrls FROM pg_stat_activity a "
                "JOIN pg_roles r ON r.rolname = a.usename WHERE a.datname = current_database() "
                "AND a.pid <> pg_backend_pid() AND a.backend_type IN ('client backend', 'walsender')")
            return {r["usename"]: (r["rolsuper"], r["rolbypassrls"]) for r in rows}
        finally:
            await conn.close()
    seen = asyncio.run(sessions())
    for service in ("admission", "executor", "reconciler", "relay"):
        assert logins.login_name(service) in seen, seen
    assert all(not (su or bypass) for su, bypass in seen.values()), seen

    async def after_reset() -> tuple[str, bool, int]:
        conn = await asyncpg.connect(logins.url_for(world.database_url, "executor"))
        try:
            await conn.execute("RESET ROLE")
            who = await conn.fetchval("SELECT current_user")
            su = await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            visible = await conn.fetchval("SELECT count(*) FROM agent_command")  # no tenant bound
            return who, su, visible
        finally:
            await conn.close()
    assert asyncio.run(after_reset()) == ("agentledger_executor_login", False, 0)


def test_an_exec_record_for_a_commit_not_yet_visible_is_retried_not_dead_lettered(world: Pipeline) -> None:
    # Issue 18 §0, the executor's twin of the commit-visibility race: a record that names a
    # command whose transaction is committed but not visible (a commit waiting for a
    # synchronous standby) was dead-lettered as `missing` and acked. Every commit of the
    # cluster now waits for a standby that does not exist: admission's parks.
    tenant = world.tenant
    with syncrep.ghost_standby(world.database_url, every_session=True):
        op = world.propose("crm.note.create", {"body": "parked"})

        def parked_xid() -> str | None:
            with psycopg2.connect(world.database_url) as conn, conn.cursor() as cur:
                cur.execute("SELECT backend_xid::text FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                            "AND usename = %s", (logins.login_name("admission"),))
                row = cur.fetchone()
                return row[0] if row else None
        assert wait_until(lambda: parked_xid() is not None, timeout=60)
        xid = parked_xid()
        # The record as the relay would publish it (the relay itself holds it: invisible).
        p = world.producer()
        p.produce(world.topic("exec.crm.v1"), key=f"{tenant}:{op}".encode(),
                  value=json.dumps({"tenant_id": tenant, "operation_id": str(op),
                                    "type": "command.admitted"}).encode(),
                  headers=[("xid", str(xid).encode()), ("commit_lsn", b"0/0")])
        assert p.flush(15) == 0
        executor_log = world.services["executor-crm"].log
        # Whichever comes first: the executor retrying it, or (the race) dead-lettering it.
        assert wait_until(lambda: f"event=exec_not_visible_yet xid={xid}" in executor_log.read_text()
                          or bool(_dead_letters_of(world, op)), timeout=60), world.services["executor-crm"].tail()
        assert _dead_letters_of(world, op) == [], "dead-lettered as missing while its commit was invisible"
    # Leaving the block releases the parked commit: the retried record finds the command.
    assert world.wait_state(op, "succeeded", timeout=90)[0] == "succeeded"
    # Everything on the exec topic handled (committed past), then: no dead letter for it.
    group = world.services["executor-crm"].env["AGENTLEDGER_EXECUTOR_GROUP_ID"]
    assert wait_until(lambda: kafka_read.lag(world.bootstrap, group, world.topic("exec.crm.v1")) == 0, timeout=60)
    assert _dead_letters_of(world, op) == []


def _dead_letters_of(world: Pipeline, op: uuid.UUID) -> list[dict[str, Any]]:
    dead = [json.loads(m.value() or b"{}") for m in kafka_read.read_to_end(
        world.bootstrap, [world.topic("exec.crm.dlq.v1")])]
    return [d for d in dead if str(op) in base64.b64decode(d.get("value_b64", "")).decode(errors="replace")]
    assert len([e for e in effects(world, "note.created") if e.get("idempotency_key") == str(op)]) == 1
