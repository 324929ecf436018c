"""The admission service end to end: proposals on Kafka → ledger + outbox → results on Kafka.

Real processes: the CRM (target resolution with a read-only token) and the admission service,
over the real broker and database. Assertions are on ledger rows and Kafka records.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from confluent_kafka import Consumer, Producer

from agentledger import identity, logins
from agentledger.contracts import topics
from agentledger.testing import identities, processes
from agentledger.testing.polling import wait_until
from tests.stack import Stack

ADMIN_TOKEN = "crm-admin-" + uuid.uuid4().hex
MARKER = "PLAINTEXT-MARKER-" + uuid.uuid4().hex


class World:
    def __init__(self, stack: Stack, database_url: str, proposals: str, admissions: str,
                 crm_url: str, tenants: dict[str, str]) -> None:
        self.stack, self.database_url = stack, database_url
        self.proposals, self.admissions, self.crm_url, self.tenants = proposals, admissions, crm_url, tenants
        self.producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
        self.results: dict[str, dict[str, Any]] = {}
        self.sent: dict[str, bytes] = {}  # proposal id -> the bytes produced
        self.consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe([admissions])

    def send(self, value: bytes | dict[str, Any], key: str = "k", *, signed: bool = True) -> None:
        if isinstance(value, dict) and signed and "identity" not in value:
            value = identities.sign(value)
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        if isinstance(value, dict):
            self.sent[str(value.get("proposal_id"))] = raw
        self.producer.produce(self.proposals, key=key.encode(), value=raw,
                              headers=[("traceparent", b"00-" + b"c" * 32 + b"-" + b"d" * 16 + b"-01")])
        assert self.producer.flush(15) == 0

    def result_for(self, proposal_id: str, timeout: float = 60) -> dict[str, Any]:
        def poll() -> bool:
            msg = self.consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                body = json.loads(msg.value())
                self.results[str(body.get("proposal_id"))] = body
            return proposal_id in self.results
        assert wait_until(poll, timeout=timeout, interval=0), f"no admission result for {proposal_id}"
        return self.results[proposal_id]


@pytest.fixture(scope="module")
def world(stack: Stack, make_database: Callable[[], str], database_url: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    logs = tmp_path_factory.mktemp("logs")
    crm_port = processes.free_port()
    crm_url = f"http://127.0.0.1:{crm_port}"
    crm_env = {"AGENTLEDGER_CRM_DATABASE_URL": make_database(), "AGENTLEDGER_CRM_PORT": str(crm_port),
               "AGENTLEDGER_CRM_ADMIN_TOKEN": ADMIN_TOKEN}
    with processes.running("agentledger.services.crm", crm_env, logs / "crm.log",
                           ready=processes.http_ok(f"{crm_url}/readyz")):
        tenants: dict[str, str] = {}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for tenant, customer in ((uuid.uuid4(), "cust-a"), (uuid.uuid4(), "cust-b")):
            r = httpx.put(f"{crm_url}/admin/tenants/{tenant}/customers/{customer}", headers=admin,
                          json={"display_name": "Ada"})
            assert r.status_code in (200, 201), r.text
            r = httpx.post(f"{crm_url}/admin/tenants/{tenant}/tokens", headers=admin, json={"scopes": ["read"]})
            assert r.status_code == 201, r.text
            tenants[str(tenant)] = r.json()["token"]
            asyncio.run(identities.put_principals(database_url, tenant, identities.DEFAULT_PRINCIPALS))
        suffix = uuid.uuid4().hex[:8]
        proposals, admissions = f"agent.proposals.t{suffix}.v1", f"agent.admissions.t{suffix}.v1"
        group = f"admission-{suffix}"
        env = {
            "AGENTLEDGER_DATABASE_URL": asyncio.run(logins.ensure(database_url, ("admission",)))["admission"],
            "AGENTLEDGER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "AGENTLEDGER_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
            "AGENTLEDGER_ADMISSION_CRM_URL": crm_url,
            "AGENTLEDGER_ADMISSION_CRM_READ_TOKENS": json.dumps(tenants),
            "AGENTLEDGER_ADMISSION_GROUP_ID": group,
            "AGENTLEDGER_ADMISSION_PROPOSALS_TOPIC": proposals,
            "AGENTLEDGER_ADMISSION_ADMISSIONS_TOPIC": admissions,
            "AGENTLEDGER_ADMISSION_PARTITIONS": "3",
            "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS": json.dumps(identities.ENVELOPE_KEYS),
            "AGENTLEDGER_ADMISSION_BUDGET_TOOL_CALLS": "10",
        }
        with processes.running("agentledger.services.admission", env, logs / "admission.log",
                               ready=processes.group_has_members(stack.kafka_bootstrap, group), timeout=90):
            w = World(stack, database_url, proposals, admissions, crm_url, tenants)
            yield w
            w.consumer.close()


def proposal(world: World, tenant_index: int = 0, **overrides: Any) -> dict[str, Any]:
    tenant = list(world.tenants)[tenant_index]
    body = {
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()), "tenant_id": tenant,
        "principal_id": "user:alice", "operation_id": str(uuid.uuid4()), "action": "crm.note.create",
        "arguments": {"customer_id": "cust-a" if tenant_index == 0 else "cust-b", "body": f"call back {MARKER}"},
        "target": "cust-a" if tenant_index == 0 else "cust-b",
        "planner": {"name": "rules"}, "created_at": datetime.now(UTC).isoformat(),
    }
    body.update(overrides)
    return body


def dead_letter_of(world: World, proposal_id: str) -> dict[str, Any]:
    """The dead-letter record of the proposal ``proposal_id`` (fails after a deadline)."""
    consumer = Consumer({"bootstrap.servers": world.stack.kafka_bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topics.dlq_topic(world.proposals)])
    found: list[dict[str, Any]] = []

    def poll() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            record = json.loads(msg.value())
            # Proposals carry payloads: their dead letters keep a digest, never the bytes.
            if record["value_sha256"] == hashlib.sha256(world.sent[proposal_id]).hexdigest():
                assert (record["value_b64"], record["value_kept"]) == ("", False), record
                assert MARKER not in msg.value().decode(errors="replace")
                found.append(record)
        return bool(found)
    try:
        assert wait_until(poll, timeout=60, interval=0), f"proposal {proposal_id} not dead-lettered"
    finally:
        consumer.close()
    return found[0]


async def _rows(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def test_proposal_is_admitted_once_with_encrypted_payload(world: World) -> None:
    p = proposal(world)
    world.send(p)
    result = world.result_for(p["proposal_id"])
    assert (result["status"], result["state"]) == ("admitted", "pending")
    assert result["allowlist_version"].startswith("sha256:")

    again = dict(p, proposal_id=str(uuid.uuid4()))  # a retry of the same intent
    world.send(again)
    assert world.result_for(again["proposal_id"])["status"] == "replayed"

    rows = await _rows(world.database_url, "SELECT * FROM agent_command WHERE operation_id=$1", uuid.UUID(p["operation_id"]))
    assert len(rows) == 1
    row = rows[0]
    assert (row["action"], row["connector"], row["resource_id"], row["principal_id"]) == (
        "crm.note.create", "crm", "cust-a", "user:alice")
    assert MARKER.encode() not in bytes(row["payload_ciphertext"])
    outbox = await _rows(world.database_url, "SELECT traceparent FROM command_outbox WHERE operation_id=$1",
                         uuid.UUID(p["operation_id"]))
    assert [o["traceparent"] for o in outbox] == ["00-" + "c" * 32 + "-" + "d" * 16 + "-01"]


async def test_same_key_different_payload_is_a_conflict(world: World) -> None:
    p = proposal(world)
    world.send(p)
    assert world.result_for(p["proposal_id"])["status"] == "admitted"
    changed = dict(p, proposal_id=str(uuid.uuid4()),
                   arguments={"customer_id": "cust-a", "body": "something else"})
    world.send(changed)
    result = world.result_for(changed["proposal_id"])
    assert (result["status"], result["reason_code"]) == ("conflict", "idempotency_conflict")
    rows = await _rows(world.database_url, "SELECT request_hash FROM agent_command WHERE operation_id=$1",
                       uuid.UUID(p["operation_id"]))
    assert len(rows) == 1


@pytest.mark.parametrize(("case", "expected_code"), [
    ("unknown_field", "poison_message"),
    ("unknown_action", "unknown_action"),
    ("overlong_body", "invalid_arguments"),
    ("other_tenants_customer", "resource_not_found"),
    ("target_mismatch", "invalid_arguments"),
    ("shadow", "shadow_refused"),
])
async def test_bad_proposals_are_rejected_and_nothing_is_written(
    world: World, case: str, expected_code: str
) -> None:
    p = proposal(world)
    if case == "unknown_field":
        p["tenant_override"] = str(uuid.uuid4())
    elif case == "unknown_action":
        p["action"] = "crm.customers.export_all"
    elif case == "overlong_body":
        p["arguments"] = {"customer_id": "cust-a", "body": "x" * 4001}
    elif case == "other_tenants_customer":
        p["target"] = "cust-b"
        p["arguments"] = {"customer_id": "cust-b", "body": "hello"}
    elif case == "target_mismatch":
        p["arguments"] = {"customer_id": "cust-b", "body": "hello"}
    elif case == "shadow":
        p["shadow"] = True
    world.send(p)
    if case == "unknown_field":
        # Unparseable against the closed schema: dead-lettered with the reason, never admitted.
        found = dead_letter_of(world, p["proposal_id"])
        assert found["error_code"] == expected_code and "tenant_override" in found["reason"]
    else:
        result = world.result_for(p["proposal_id"])
        assert (result["status"], result["reason_code"]) == ("rejected", expected_code), result
        assert result["reason"]
    count = await _rows(world.database_url, "SELECT count(*) AS n FROM agent_command WHERE operation_id=$1",
                        uuid.UUID(p["operation_id"]))
    assert count[0]["n"] == 0


async def test_no_plaintext_payload_in_a_database_dump(world: World) -> None:
    import shutil
    import subprocess

    p = proposal(world)
    world.send(p)
    assert world.result_for(p["proposal_id"])["status"] == "admitted"
    # A refund waiting for a person, with an evidence excerpt the planner read (issue 17 §5:
    # approval requests kept evidence in plaintext jsonb).
    r = _refund(world, 4200, evidence=[{"ref": "E1", "source": "crm:customers/cust-a", "sha256": "0" * 64,
                                        "fetched_at": datetime.now(UTC).isoformat(),
                                        "excerpt": f"customer said {MARKER}"}])
    world.send(r)
    assert world.result_for(r["proposal_id"])["status"] == "pending_approval"
    stored = await _rows(world.database_url, "SELECT evidence, evidence_ciphertext FROM approval_request "
                         "WHERE operation_id=$1", uuid.UUID(r["operation_id"]))
    assert stored[0]["evidence_ciphertext"] is not None
    assert [e["ref"] for e in json.loads(stored[0]["evidence"])] == ["E1"]  # refs and digests stay
    pg_dump = shutil.which("pg_dump") or "/usr/lib/postgresql/15/bin/pg_dump"
    done = await asyncio.to_thread(subprocess.run, [pg_dump, "--data-only", world.database_url],
                                   capture_output=True, check=True, timeout=120)
    dump = done.stdout.decode(errors="replace")
    assert p["operation_id"] in dump and r["operation_id"] in dump  # the dump has the rows...
    assert MARKER not in dump  # ...but never a payload or an evidence excerpt in clear


async def test_identity_is_bound_by_the_envelope_not_by_the_message(world: World) -> None:
    # Unsigned → rejected; signed for alice but claiming bob → rejected; nothing written.
    unsigned = proposal(world)
    world.send(unsigned, signed=False)
    assert world.result_for(unsigned["proposal_id"])["reason_code"] == "identity_rejected"
    forged = identities.sign(proposal(world))
    forged["principal_id"] = "user:bob"
    world.send(forged)
    assert world.result_for(forged["proposal_id"])["reason_code"] == "identity_rejected"
    other_op = identities.sign(proposal(world))
    other_op["operation_id"] = str(uuid.uuid4())
    world.send(other_op)
    assert world.result_for(other_op["proposal_id"])["reason_code"] == "identity_rejected"
    for p in (unsigned, forged, other_op):
        n = await _rows(world.database_url, "SELECT count(*) AS n FROM agent_command WHERE operation_id=$1",
                        uuid.UUID(p["operation_id"]))
        assert n[0]["n"] == 0


async def test_refund_needs_approval_and_waits_as_a_persisted_request(world: World) -> None:
    p = proposal(world, action="billing.refund.create",
                 arguments={"customer_id": "cust-a", "invoice_id": "inv-7", "amount_minor": 1500,
                            "currency": "EUR", "reason": "broken"})
    world.send(p)
    result = world.result_for(p["proposal_id"])
    assert result["status"] == "pending_approval" and result["approval_id"]
    rows = await _rows(world.database_url, "SELECT state, request_hash FROM approval_request WHERE approval_id=$1",
                       uuid.UUID(result["approval_id"]))
    assert rows[0]["state"] == "pending"
    decisions = await _rows(world.database_url, "SELECT effect, policy_version FROM policy_decision "
                            "WHERE operation_id=$1", uuid.UUID(p["operation_id"]))
    assert [d["effect"] for d in decisions] == ["require_approval"]
    assert decisions[0]["policy_version"].startswith("cedar/sha256:")
    n = await _rows(world.database_url, "SELECT count(*) AS n FROM agent_command WHERE operation_id=$1",
                    uuid.UUID(p["operation_id"]))
    assert n[0]["n"] == 0  # nothing is admitted before a person decides


def _refund(world: World, amount: int, **overrides: Any) -> dict[str, Any]:
    return proposal(world, action="billing.refund.create",
                    arguments={"customer_id": "cust-a", "invoice_id": "inv-7", "amount_minor": amount,
                               "currency": "EUR", "reason": "broken"}, **overrides)


async def _approvals_of(world: World, operation_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await _rows(
        world.database_url, "SELECT proposal_id, state, request_hash FROM approval_request "
        "WHERE operation_id=$1 ORDER BY created_at", uuid.UUID(operation_id))]


async def test_a_gateway_envelope_replayed_with_a_new_amount_changes_nothing(world: World) -> None:
    # Issue 17 §6: the envelope of a pending refund, copied onto a proposal with a new amount
    # (same proposal id, or a fresh one), used to supersede the request the user made.
    asked = identities.sign(_refund(world, 1500))
    world.send(asked)
    assert world.result_for(asked["proposal_id"])["status"] == "pending_approval"
    before = await _approvals_of(world, asked["operation_id"])
    world.results.pop(asked["proposal_id"])
    replays = [dict(asked, arguments={**asked["arguments"], "amount_minor": 990_000}),
               dict(asked, proposal_id=str(uuid.uuid4()),
                    arguments={**asked["arguments"], "amount_minor": 990_000})]
    for replay in replays:
        world.send(replay)
        result = world.result_for(replay["proposal_id"])
        assert (result["status"], result["reason_code"]) == ("rejected", "identity_rejected"), result
        assert "content its envelope was issued for" in result["reason"]
    assert await _approvals_of(world, asked["operation_id"]) == before  # still the 1500 request, pending
    assert before[0]["state"] == "pending" and len(before) == 1


async def test_a_planners_envelope_admits_only_the_proposal_planned_from_its_request(world: World) -> None:
    # A request's envelope travels on the planner's proposal; a copy with a new amount under
    # the same (derived) proposal id must not supersede the pending request, and a copy under
    # another id is not the planned proposal at all.
    tenant, request_id, op = next(iter(world.tenants)), uuid.uuid4(), str(uuid.uuid4())
    envelope = identities.SIGNER.sign(
        tenant_id=uuid.UUID(tenant), principal_id="user:alice", operation_id=uuid.UUID(op),
        request_id=request_id, binding=identity.request_binding(goal="refund inv-7", resource="cust-a"))
    planned = str(identity.planned_proposal_id(request_id))
    asked = _refund(world, 1500, operation_id=op, proposal_id=planned, identity=envelope)
    world.send(asked)
    assert world.result_for(planned)["status"] == "pending_approval"
    before = await _approvals_of(world, op)
    world.results.pop(planned)
    world.send(_refund(world, 990_000, operation_id=op, proposal_id=planned, identity=envelope))
    replayed = world.result_for(planned)
    assert (replayed["status"], replayed["reason_code"]) == ("rejected", "identity_rejected"), replayed
    assert "replayed envelope" in replayed["reason"]
    elsewhere = _refund(world, 990_000, operation_id=op, identity=envelope)
    world.send(elsewhere)
    assert world.result_for(elsewhere["proposal_id"])["reason_code"] == "identity_rejected"
    assert await _approvals_of(world, op) == before and before[0]["state"] == "pending"
    audited = await _rows(world.database_url, "SELECT payload FROM audit_event WHERE operation_id=$1 "
                          "AND type='proposal.rejected'", uuid.UUID(op))
    assert [json.loads(a["payload"])["code"] for a in audited] == ["identity_rejected"]


async def test_a_revoked_principal_is_denied_and_the_decision_recorded(world: World, database_url: str) -> None:
    from agentledger.policy import repository as policy_repo

    tenant = list(world.tenants)[1]
    conn = await asyncpg.connect(database_url)
    try:
        await policy_repo.put_principal(conn, uuid.UUID(tenant), "user:mallory", ["user"])
        await policy_repo.revoke_principal(conn, uuid.UUID(tenant), "user:mallory")
    finally:
        await conn.close()
    p = proposal(world, tenant_index=1, principal_id="user:mallory")
    world.send(p)
    result = world.result_for(p["proposal_id"])
    assert (result["status"], result["reason_code"]) == ("rejected", "policy_denied")
    decisions = await _rows(world.database_url, "SELECT effect FROM policy_decision WHERE operation_id=$1",
                            uuid.UUID(p["operation_id"]))
    assert [d["effect"] for d in decisions] == ["deny"]


async def test_fifty_parallel_steps_against_ten_tool_calls_admit_exactly_ten(world: World) -> None:
    request_id = uuid.uuid4()  # one workflow: every step's envelope names the same request
    steps = [identities.sign(proposal(world, tenant_index=1), request_id=request_id) for _ in range(50)]
    for s in steps:
        world.send(s)
    results = [world.result_for(s["proposal_id"], timeout=120) for s in steps]
    statuses = sorted((r["status"], r.get("reason_code")) for r in results)
    assert statuses.count(("admitted", None)) == 10, statuses
    assert statuses.count(("rejected", "budget_exhausted")) == 40, statuses
    rows = await _rows(world.database_url, "SELECT limit_amount, reserved, used FROM budget WHERE workflow_id=$1",
                       str(request_id))
    assert [(r["limit_amount"], r["reserved"], r["used"]) for r in rows] == [(10, 0, 10)]
    audited = await _rows(world.database_url, "SELECT count(*) AS n FROM event_outbox WHERE type='budget.exhausted' "
                          "AND payload->>'workflow_id' = $1", str(request_id))
    assert audited[0]["n"] == 40


@pytest.mark.parametrize("where", ["planner.name", "evidence.excerpt", "argument key"])
async def test_a_nul_character_is_dead_lettered_and_the_partition_moves_on(world: World, where: str) -> None:
    # Issue 17: a NUL (U+0000) that Postgres cannot store made the audit write fail, which
    # was taken for an outage and redelivered forever; the next proposal of the same key
    # (same partition) was never admitted.
    bad = proposal(world)
    if where == "planner.name":
        bad["planner"] = {"name": "rules\u0000"}
    elif where == "evidence.excerpt":
        bad["evidence"] = [{"ref": "E1", "source": "crm:customers/cust-a", "sha256": "0" * 64,
                            "fetched_at": datetime.now(UTC).isoformat(), "excerpt": "Ada\u0000"}]
    else:
        bad["arguments"] = {"customer_id": "cust-a", "body\u0000": "hello"}
    good = proposal(world)
    key = f"nul-{uuid.uuid4().hex}"
    world.send(bad, key=key)
    world.send(good, key=key)
    assert world.result_for(good["proposal_id"])["status"] == "admitted"
    found = dead_letter_of(world, bad["proposal_id"])
    assert found["error_code"] == "poison_message" and "U+0000" in found["reason"], found
    assert not await _rows(world.database_url, "SELECT 1 FROM agent_command WHERE operation_id=$1",
                           uuid.UUID(bad["operation_id"]))
