"""Payloads at rest (R3.6): encrypted per tenant, bound to their row, purged by retention."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentledger import approvals, crypto, errors
from agentledger.ledger import keys, repository
from agentledger.testing.ledger import new_row as new_command


@pytest.fixture
def cipher() -> keys.PayloadCipher:
    return keys.PayloadCipher(crypto.MasterKey(os.urandom(32)))


async def _admit_encrypted(db: asyncpg.Connection, cipher: keys.PayloadCipher, body: bytes,
                           tenant: uuid.UUID | None = None) -> repository.NewCommand:
    cmd = new_command(tenant)
    blob, version = await cipher.encrypt(db, cmd.tenant_id, cmd.operation_id, body)
    cmd = dataclasses.replace(cmd, payload_ciphertext=blob, payload_key_version=version)
    assert (await repository.admit(db, cmd)).status == "admitted"
    return cmd


async def _purge_as_maintenance(database_url: str) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Retention as its CronJob runs it: the maintenance role, a day's window."""
    maintenance = await asyncpg.connect(database_url)
    try:
        await maintenance.execute("SET ROLE agentledger_maintenance")
        return await repository.purge_payloads(maintenance, older_than_s=86_400)
    finally:
        await maintenance.close()


async def test_round_trip_and_one_key_per_tenant(db: asyncpg.Connection, cipher: keys.PayloadCipher) -> None:
    a = await _admit_encrypted(db, cipher, b'{"body":"secret one"}')
    b = await _admit_encrypted(db, cipher, b'{"body":"secret two"}', tenant=a.tenant_id)
    stored = await repository.load_command(db, a.tenant_id, a.operation_id)
    assert await cipher.decrypt(db, a.tenant_id, a.operation_id, bytes(stored["payload_ciphertext"]),
                                stored["payload_key_version"]) == b'{"body":"secret one"}'
    assert await db.fetchval("SELECT count(*) FROM tenant_data_key WHERE tenant_id=$1", a.tenant_id) == 1
    # A fresh process (empty cache, same master key) reads it too.
    fresh = keys.PayloadCipher(cipher._master)
    stored_b = await repository.load_command(db, b.tenant_id, b.operation_id)
    assert await fresh.decrypt(db, b.tenant_id, b.operation_id, bytes(stored_b["payload_ciphertext"]),
                               1) == b'{"body":"secret two"}'


async def test_ciphertext_moved_to_another_row_or_tenant_fails(db: asyncpg.Connection, cipher: keys.PayloadCipher) -> None:
    a = await _admit_encrypted(db, cipher, b"alpha")
    b = await _admit_encrypted(db, cipher, b"beta", tenant=a.tenant_id)
    other_tenant = await _admit_encrypted(db, cipher, b"gamma")
    with pytest.raises(errors.DecryptionFailed):
        await cipher.decrypt(db, b.tenant_id, b.operation_id, a.payload_ciphertext, 1)
    with pytest.raises(errors.DecryptionFailed):
        await cipher.decrypt(db, other_tenant.tenant_id, other_tenant.operation_id, a.payload_ciphertext, 1)
    wrong_master = keys.PayloadCipher(crypto.MasterKey(os.urandom(32)))
    with pytest.raises(errors.DecryptionFailed):
        await wrong_master.decrypt(db, a.tenant_id, a.operation_id, a.payload_ciphertext, 1)


async def test_retention_purges_payloads_but_replay_still_detected(
    database_url: str, db: asyncpg.Connection, cipher: keys.PayloadCipher
) -> None:
    done = await _admit_encrypted(db, cipher, b"old and finished")
    live = await _admit_encrypted(db, cipher, b"still pending")
    await db.execute(
        "UPDATE agent_command SET state='succeeded', provider_receipt='r-1', "
        "finished_at = now() - interval '2 days' WHERE operation_id=$1", done.operation_id,
    )
    purged = await _purge_as_maintenance(database_url)
    assert (done.tenant_id, done.operation_id) in purged
    assert (live.tenant_id, live.operation_id) not in purged
    row = await db.fetchrow("SELECT payload_ciphertext, payload_purged_at, request_hash, state "
                            "FROM agent_command WHERE operation_id=$1", done.operation_id)
    assert row["payload_ciphertext"] is None and row["payload_purged_at"] is not None
    assert row["request_hash"] == done.request_hash and row["state"] == "succeeded"
    assert (await db.fetchval("SELECT payload_ciphertext FROM agent_command WHERE operation_id=$1",
                              live.operation_id)) is not None

    replay = await repository.admit(db, done)
    assert (replay.status, replay.recorded.state, replay.recorded.provider_receipt,
            replay.recorded.payload_purged) == ("replayed", "succeeded", "r-1", True)
    conflict = await repository.admit(db, dataclasses.replace(done, request_hash=os.urandom(32)))
    assert conflict.status == "conflict"


async def _request_approval(db: asyncpg.Connection, cipher: keys.PayloadCipher, excerpt: str) -> approvals.Approval:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    blob, version = await cipher.encrypt(db, tenant, op, b'{"amount_minor": 4200}')
    full = [{"ref": "E1", "source": "crm:customers/c-1", "sha256": "0" * 64,
             "fetched_at": "2026-12-01T00:00:00+00:00", "excerpt": excerpt}]
    sealed, sealed_version = await cipher.encrypt(db, tenant, approvals.evidence_aad(op), json.dumps(full).encode())
    command = repository.NewCommand(
        tenant_id=tenant, operation_id=op, principal_id="user:alice",
        action="billing.refund.create", connector="billing", resource_id="c-1", expected_revision=None,
        request_hash=os.urandom(32), payload_ciphertext=blob, payload_key_version=version,
        policy_version="cedar/sha256:t", allowlist_version="sha256:t", decision_id=uuid.uuid4(),
        expires_at=datetime.now(UTC) + timedelta(hours=1))
    requested = await approvals.request(db, approvals.NewApproval(
        command=command, proposal_id=uuid.uuid4(), risk="high",
        evidence=[{k: v for k, v in e.items() if k != "excerpt"} for e in full],
        evidence_ciphertext=sealed, evidence_key_version=sealed_version))
    assert requested.approval is not None
    return requested.approval


async def test_retention_purges_decided_approval_requests_payload_and_evidence(
    database_url: str, db: asyncpg.Connection, cipher: keys.PayloadCipher
) -> None:
    # Issue 17 §5: an approval request kept its payload ciphertext after the decision and the
    # maintenance role could not reach it; its evidence excerpts rested in plaintext.
    decided = await _request_approval(db, cipher, "old excerpt")
    pending = await _request_approval(db, cipher, "live excerpt")
    assert b"excerpt" not in json.dumps(decided.evidence).encode()  # only refs and digests in clear
    plain = await cipher.decrypt(db, decided.tenant_id, approvals.evidence_aad(decided.operation_id),
                                 decided.evidence_ciphertext, decided.evidence_key_version)  # type: ignore[arg-type]
    assert json.loads(plain)[0]["excerpt"] == "old excerpt"
    with pytest.raises(errors.DecryptionFailed):  # evidence is never readable as the payload
        await cipher.decrypt(db, decided.tenant_id, decided.operation_id, decided.evidence_ciphertext,  # type: ignore[arg-type]
                             decided.evidence_key_version)  # type: ignore[arg-type]
    await db.execute("UPDATE approval_request SET state = 'denied', decided_by = 'user:bob', "
                     "decided_at = now() - interval '2 days' WHERE approval_id = $1", decided.approval_id)
    # A row written before 0016 kept its excerpt in the jsonb: retention strips it too.
    await db.execute("UPDATE approval_request SET evidence = jsonb_set(evidence, '{0,excerpt}', '\"legacy\"') "
                     "WHERE approval_id = $1", decided.approval_id)
    purged = await _purge_as_maintenance(database_url)
    assert (decided.tenant_id, decided.operation_id) in purged
    assert (pending.tenant_id, pending.operation_id) not in purged
    row = await db.fetchrow("SELECT * FROM approval_request WHERE approval_id = $1", decided.approval_id)
    assert (row["payload_ciphertext"], row["evidence_ciphertext"]) == (None, None)
    assert row["payload_purged_at"] is not None and bytes(row["request_hash"]) == decided.request_hash
    assert json.loads(row["evidence"]) == [{"ref": "E1", "source": "crm:customers/c-1", "sha256": "0" * 64,
                                            "fetched_at": "2026-12-01T00:00:00+00:00"}]
    live = await db.fetchrow("SELECT * FROM approval_request WHERE approval_id = $1", pending.approval_id)
    assert live["payload_ciphertext"] is not None and live["evidence_ciphertext"] is not None
