"""Evidence an auditor can verify offline (issue 43), on the real ledger: operations run
through admission, approval, the executor against the CRM and an operator's resolution; the
notary sequences and signs; receipts are exported and verified with only a JWKS; and the
tenant's log is walked by ``verify-chain`` after a superuser edits, deletes or swaps rows,
forges checkpoints, or retention purges payloads."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import errors, settings
from agentledger.evidence import chain, checkpoint, keys, leaf, merkle, notary, receipt
from agentledger.ledger import keys as ledger_keys
from agentledger.ledger import repository, resolutions
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World

NOTE = "crm.note.create"
REFUND = "billing.refund.create"

crm, world = executor_world.fixtures()


class Rollback(Exception):
    """Ends a superuser's tampering transaction: the rows are as before for the next test."""


@pytest.fixture
def key_dir(tmp_path: Path) -> Path:
    keys.generate(tmp_path / "keys")
    return tmp_path / "keys"


@pytest.fixture
async def notary_conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    await conn.execute("SET ROLE agentledger_notary")
    yield conn
    await conn.close()


@pytest.fixture
async def auditor(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    await conn.execute("SET ROLE agentledger_auditor")
    yield conn
    await conn.close()


def trusted(key_dir: Path) -> dict[str, ed25519.Ed25519PublicKey]:
    return {keys.key_id(k): k for k in keys.public_keys(key_dir)}


async def note(world: World, t: Tenant, body: str) -> uuid.UUID:
    op = await world.admit(t, NOTE, {"body": body})
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "succeeded"
    return op


async def lost_refund_resolved(world: World, t: Tenant) -> uuid.UUID:
    """A refund approved by a human, its answer lost (`unknown`), resolved by an operator."""
    op = await world.admit(t, REFUND, {"invoice_id": f"inv-{uuid.uuid4().hex[:6]}",
                                       "amount_minor": 900, "currency": "EUR",
                                       "reason": "double charge"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "drop_after_commit", "times": 1})
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "unknown"
    async with world.reconciler_pool.acquire() as conn:
        await resolutions.resolve_unknown(
            conn, t.tenant_id, op, outcome="succeeded", resolved_by="user:olga",
            reason="the refund is in the provider's dashboard", receipt_check="unchecked",
            check_detail="refunds have no lookup", receipt="refund-123")
    return op


async def export(auditor: asyncpg.Connection, world: World, t: Tenant, op: uuid.UUID,
                 *, with_arguments: bool = True) -> bytes:
    bound = None
    if with_arguments:
        async with world.pool.acquire() as conn:
            bound = await receipt.bound_fields(conn, ledger_keys.PayloadCipher(world.master),
                                               t.tenant_id, op)
    return (await receipt.export(auditor, t.tenant_id, op, bound=bound)).to_bytes()


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed `agentledger` with a database URL that answers nothing: offline."""
    env = {**os.environ, "AGENTLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    return subprocess.run([str(settings.REPO_ROOT / ".venv/bin/agentledger"), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


async def test_a_receipt_verifies_offline_and_every_edited_byte_is_refused(
        world: World, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        key_dir: Path, tmp_path: Path, database_url: str) -> None:
    t = await world.tenant()
    await note(world, t, "a first note")
    op = await lost_refund_resolved(world, t)
    await notary.catch_up(notary_conn, notary.Notary(keys.load_signer(key_dir)))
    data = await export(auditor, world, t, op)

    found = receipt.verify(data, trusted(key_dir))
    doc = json.loads(data)
    assert found.bound_checked and found.events == len(doc["leaves"])
    types = [x["event"]["type"] for x in doc["leaves"]]
    assert types[0] == "approval.requested" and "approval.approved" in types
    assert "command.claimed" in types and types[-1] == "command.reconciled"
    s = doc["summary"]
    approved = next(a for a in s["approvals"] if a["type"] == "approval.approved")
    assert approved["decided_by"] == "user:fiona"
    assert approved["request_hash"] == doc["command"]["request_hash"]
    assert s["resolutions"][0]["resolved_by"] == "user:olga"
    assert s["resolutions"][0]["receipt_check"] == "unchecked"
    assert s["outcome"]["type"] == "command.reconciled"
    assert any(p.get("policy_version") for p in s["policy"])
    assert doc["command"]["bound"]["arguments"]["amount_minor"] == 900
    # the events are the ledger's: same ids as audit_event holds for the operation
    async with world.owner.acquire() as conn:
        ids = [str(r["event_id"]) for r in await conn.fetch(
            "SELECT event_id FROM audit_event WHERE operation_id = $1 ORDER BY seq", op)]
    assert [x["event"]["event_id"] for x in doc["leaves"]] == ids

    # Offline, through the command line: a database URL that answers nothing.
    (tmp_path / "receipt.json").write_bytes(data)
    (tmp_path / "jwks.json").write_text(json.dumps(keys.jwks(key_dir)))
    ok = run_cli("evidence", "verify", "receipt.json", "--jwks", "jwks.json", cwd=tmp_path)
    assert ok.returncode == 0 and "verified" in ok.stdout, ok.stdout + ok.stderr

    # `explain --jwks` says the operation's evidence verifies.
    env = {**os.environ, "AGENTLEDGER_DATABASE_URL": database_url}
    shown = await asyncio.to_thread(
        subprocess.run, [str(settings.REPO_ROOT / ".venv/bin/agentledger"), "explain", str(op),
                         "--tenant", str(t.tenant_id), "--jwks", "jwks.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"evidence  verified: {len(doc['leaves'])} events" in shown.stdout, shown.stdout

    # Every single byte changed: refused, every time.
    for i in range(len(data)):
        edited = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
        with pytest.raises(errors.EvidenceInvalid):
            receipt.verify(edited, trusted(key_dir))

    # A value changed in place is named by its field.
    def edited(path: list[Any], value: Any) -> bytes:
        copy = json.loads(data)
        target = copy
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        return json.dumps(copy, separators=(",", ":"), sort_keys=True,
                          ensure_ascii=False).encode() + b"\n"

    cases: list[tuple[list[Any], Any, str]] = [
        (["summary", "resolutions", 0, "resolved_by"], "user:mallory",
         "summary.resolutions[0].resolved_by"),
        (["summary", "approvals", 1, "decided_by"], "user:mallory",
         "summary.approvals[1].decided_by"),
        (["leaves", 0, "event", "payload", "risk"], "low", "leaves[0].event"),
        (["leaves", 1, "leaf_hash"], "00" * 32, "leaves[1].inclusion_proof"),
        (["leaves", 0, "inclusion_proof", 0], "11" * 32, "leaves[0].inclusion_proof"),
        (["command", "bound", "arguments", "amount_minor"], 90000, "command.bound"),
        (["command", "request_hash"], "ab" * 32, "command.request_hash"),
        (["checkpoint", "signature"], "00" * 64, "checkpoint.signature"),
        (["operation_id"], str(uuid.uuid4()), "leaves[0].event.operation_id"),
    ]
    for path, value, field in cases:
        with pytest.raises(errors.EvidenceInvalid) as refused:
            receipt.verify(edited(path, value), trusted(key_dir))
        assert refused.value.field == field, (path, refused.value.message)
    bad = run_cli("evidence", "verify", "edited.json", "--jwks", "jwks.json", cwd=tmp_path) \
        if (tmp_path / "edited.json").write_bytes(edited(*cases[0][:2])) else None
    assert bad is not None and bad.returncode == 2
    assert "summary.resolutions[0].resolved_by" in bad.stdout, bad.stdout

    # Another notary's key: the receipt is refused, naming the checkpoint's key id.
    other = tmp_path / "other"
    keys.generate(other)
    with pytest.raises(errors.EvidenceInvalid) as refused:
        receipt.verify(data, trusted(other))
    assert refused.value.field == "checkpoint.body.key_id"


async def test_verify_chain_names_the_row_a_superuser_edited_deleted_or_swapped(
        world: World, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        db: asyncpg.Connection, key_dir: Path) -> None:
    t = await world.tenant()
    for i in range(4):
        await note(world, t, f"note {i}")
    await notary.catch_up(notary_conn, notary.Notary(keys.load_signer(key_dir)))
    report = await chain.verify_chain(auditor, t.tenant_id, trusted(key_dir))
    assert report.entries == 12 and report.tree_size == 12  # admitted, claimed, succeeded, 4 times
    logged = await db.fetch("SELECT idx, seq FROM audit_log WHERE tenant_id = $1 ORDER BY idx",
                            t.tenant_id)
    victim, after = int(logged[5]["seq"]), int(logged[6]["seq"])

    async def refused(*tamper: str) -> errors.EvidenceInvalid:
        with pytest.raises(Rollback):
            async with db.transaction():
                await db.execute("SET LOCAL session_replication_role = replica")  # no triggers
                for statement in tamper:
                    await db.execute(statement)
                with pytest.raises(errors.EvidenceInvalid) as caught:
                    await chain.verify_chain(db, t.tenant_id, trusted(key_dir))
                raise Rollback
        return caught.value

    edited = await refused(
        f"UPDATE audit_event SET payload = payload || '{{\"worker_id\": \"w9\"}}' "
        f"WHERE seq = {victim}")
    assert edited.field == f"log position 5 (seq {victim})", edited.message
    assert "content was edited" in edited.message
    # what `explain --jwks` says of that operation while the row is edited
    victim_op = await db.fetchval("SELECT operation_id FROM audit_event WHERE seq = $1", victim)
    with pytest.raises(Rollback):
        async with db.transaction():
            await db.execute("SET LOCAL session_replication_role = replica")
            await db.execute("UPDATE audit_event SET payload = payload || '{\"kind\": \"x\"}' "
                             "WHERE seq = $1", victim)
            said = await receipt.status(db, t.tenant_id, victim_op, trusted(key_dir))
            assert said.startswith("BROKEN at log position 5"), said
            raise Rollback
    assert (await receipt.status(auditor, t.tenant_id, victim_op, trusted(key_dir))
            ).startswith("verified: 3 events")
    deleted = await refused(f"DELETE FROM audit_event WHERE seq = {victim}")
    assert deleted.field == f"log position 5 (seq {victim})", deleted.message
    assert "gone" in deleted.message
    cursor = await db.fetchval("SELECT last_seq FROM audit_notary_cursor")
    inserted = await refused(
        "INSERT INTO audit_event (event_id, seq, tenant_id, operation_id, type, payload, "
        "recorded_at, leaf_hash) OVERRIDING SYSTEM VALUE "
        f"SELECT gen_random_uuid(), {cursor}, tenant_id, operation_id, type, payload, "
        f"recorded_at, leaf_hash FROM audit_event WHERE seq = {victim}")
    assert inserted.field == f"audit row seq {cursor}", inserted.message
    assert "never held" in inserted.message
    swapped = await refused(
        "ALTER TABLE audit_event ALTER COLUMN seq SET GENERATED BY DEFAULT",
        f"UPDATE audit_event SET seq = -1 WHERE seq = {victim}",
        f"UPDATE audit_event SET seq = {victim} WHERE seq = {after}",
        f"UPDATE audit_event SET seq = {after} WHERE seq = -1")
    assert swapped.field == f"log position 5 (seq {victim})", swapped.message
    # Rewriting the row, its hash and the log's leaf too: the signed root no longer matches.
    rewritten = await refused(
        f"UPDATE audit_event SET payload = payload || '{{\"worker_id\": \"w9\"}}' "
        f"WHERE seq = {victim}",
        f"UPDATE audit_event SET leaf_hash = agentledger_audit_leaf_hash(event_id, tenant_id, "
        f"operation_id, type, payload, traceparent, recorded_at) WHERE seq = {victim}",
        f"UPDATE audit_log l SET leaf_hash = e.leaf_hash FROM audit_event e "
        f"WHERE e.seq = l.seq AND l.seq = {victim}")
    assert rewritten.field.startswith("checkpoint at tree size"), rewritten.message
    # nothing stayed changed
    assert (await chain.verify_chain(auditor, t.tenant_id, trusted(key_dir))).entries == 12


async def test_checkpoints_by_another_key_or_disagreeing_about_the_past_are_refused(
        world: World, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        db: asyncpg.Connection, key_dir: Path, tmp_path: Path, database_url: str) -> None:
    t = await world.tenant()
    signer = keys.load_signer(key_dir)
    worker = notary.Notary(signer)
    await note(world, t, "before")
    await notary.catch_up(notary_conn, worker)
    await note(world, t, "after")
    await notary.catch_up(notary_conn, worker)
    report = await chain.verify_chain(auditor, t.tenant_id, trusted(key_dir))
    assert (report.checkpoints, report.tree_size) == (2, 6)
    leaves = [bytes(r["leaf_hash"]) for r in await db.fetch(
        "SELECT leaf_hash FROM audit_log WHERE tenant_id = $1 ORDER BY idx", t.tenant_id)]

    # The JWKS an auditor holds does not have the notary's key: every checkpoint is refused.
    other = tmp_path / "other"
    keys.generate(other)
    with pytest.raises(errors.EvidenceInvalid) as refused:
        await chain.verify_chain(auditor, t.tenant_id, trusted(other))
    assert refused.value.field == "checkpoint at tree size 3"
    assert "trusted keys do not hold" in refused.value.message
    # the same through the command line
    (tmp_path / "jwks.json").write_text(json.dumps(keys.jwks(key_dir)))
    (tmp_path / "other.json").write_text(json.dumps(keys.jwks(other)))

    def verify_chain_cli(jwks: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(settings.REPO_ROOT / ".venv/bin/agentledger"), "evidence", "verify-chain",
             "--tenant", str(t.tenant_id), "--jwks", jwks], cwd=tmp_path,
            env={**os.environ, "AGENTLEDGER_DATABASE_URL": database_url}, capture_output=True,
            text=True, timeout=60, check=False)

    ok = await asyncio.to_thread(verify_chain_cli, "jwks.json")
    assert ok.returncode == 0 and "verified: 6 entries, 2 checkpoints" in ok.stdout, ok.stdout
    bad = await asyncio.to_thread(verify_chain_cli, "other.json")
    assert bad.returncode == 2 and "checkpoint at tree size 3" in bad.stdout, bad.stdout

    async def forged(cp: checkpoint.Checkpoint, *, replace: bool) -> errors.EvidenceInvalid:
        with pytest.raises(Rollback):
            async with db.transaction():
                await db.execute("SET LOCAL session_replication_role = replica")
                if replace:
                    await db.execute("DELETE FROM audit_checkpoint WHERE tenant_id = $1 "
                                     "AND tree_size = $2", t.tenant_id, cp.tree_size)
                await db.execute(
                    "INSERT INTO audit_checkpoint (tenant_id, tree_size, root_hash, last_seq, "
                    "key_id, signed_at, body, signature, frontier) "
                    "VALUES ($1, $2, $3, 0, $4, now(), $5, $6, '{}')", t.tenant_id,
                    cp.tree_size, cp.root_hash, cp.key_id, cp.body, cp.signature)
                with pytest.raises(errors.EvidenceInvalid) as caught:
                    await chain.verify_chain(db, t.tenant_id, trusted(key_dir))
                raise Rollback
        return caught.value

    # A checkpoint signed by a key outside the JWKS is refused at that checkpoint.
    intruder = keys.Signer(keys.generate(tmp_path / "intruder"),
                           keys.load_signer(tmp_path / "intruder").private)
    stranger = checkpoint.sign(intruder, tenant_id=str(t.tenant_id), tree_size=7,
                               root_hash=merkle.root(leaves), at=datetime.now(UTC))
    refused_key = await forged(stranger, replace=False)
    assert refused_key.field == "checkpoint at tree size 7"
    assert "trusted keys do not hold" in refused_key.message

    # The notary's own key signs a second history: its first entry rewritten. The two signed
    # checkpoints disagree about the past; the consistency proof says so.
    history = [merkle.leaf_hash(b"a rewritten first event"), *leaves[1:]]
    rewrite = checkpoint.sign(signer, tenant_id=str(t.tenant_id), tree_size=6,
                              root_hash=merkle.root(history), at=datetime.now(UTC))
    disagree = await forged(rewrite, replace=True)
    assert disagree.field == "checkpoint at tree size 6", disagree.message
    assert "disagrees about the past with the checkpoint at tree size 3" in disagree.message


async def test_the_log_and_receipts_still_verify_after_the_retention_purge(
        world: World, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        database_url: str, key_dir: Path) -> None:
    t = await world.tenant()
    op = await note(world, t, "to be purged")
    await notary.catch_up(notary_conn, notary.Notary(keys.load_signer(key_dir)))
    before = await export(auditor, world, t, op)
    maintenance = await asyncpg.connect(database_url)
    try:
        await maintenance.execute("SET ROLE agentledger_maintenance")
        purged = await repository.purge_payloads(maintenance, older_than_s=0)
    finally:
        await maintenance.close()
    assert (t.tenant_id, op) in purged
    row = await world.row(t, op)
    assert row["payload_ciphertext"] is None and row["payload_purged_at"] is not None
    await notary.catch_up(notary_conn, notary.Notary(keys.load_signer(key_dir)))
    assert (await chain.verify_chain(auditor, t.tenant_id, trusted(key_dir))).entries >= 3
    assert receipt.verify(before, trusted(key_dir)).bound_checked
    after = await export(auditor, world, t, op)
    doc = json.loads(after)
    assert doc["command"] == {"request_hash": json.loads(before)["command"]["request_hash"],
                              "bound": None, "withheld": "purged"}
    assert not receipt.verify(after, trusted(key_dir)).bound_checked


async def test_the_databases_canonical_form_is_rfc8785(db: asyncpg.Connection) -> None:
    """The SQL canonicalizer against the rfc8785 package, over awkward values: numbers of
    every magnitude (ECMAScript's layout), escapes, non-ASCII, nesting, key order."""
    values: list[Any] = [
        0, -0.0, 1, -1, 1.0, 1.5, 0.1, 0.000001, 0.0000001, 1e-7, 123456789.125, 1e20, 1e21,
        1.5e21, -2.5e-9, 9007199254740991, -9007199254740991, 9007199254740992, 2**60,
        5e-324, 1.7976931348623157e308, 3.14159, 100, 1e15, 1e16, 123e-20,
        "", "a\"b\\c", "\b\f\n\r\t\x01\x1f\x7f", "é ☃ 😀 \u2028", "/", True, False, None,
        [], {}, [1, [2, [3, {"z": 1, "a": [None, "x"]}]]],
        {"b": 1, "a": 2, "aa": 3, "B": 4, "é": 5, "\u00ff": 6, "_": 7, "": 8},
        {"n": 1234567890123456, "m": 123456789012345, "f": [0.5, 1e21, -0.0, 10.0, -7],
         "s": "q\"\n\u0001é", "o": {"x": [1.25e-7, True, None, {}]}},
        # RFC 8785 orders names by UTF-16 code units: a name above U+FFFF (a surrogate pair)
        # sorts before one in U+E000-U+FFFF, where code point order puts it after.
        {"\uffff": 1, "😀": 2}, {"\ue000": 1, "\U0010ffff": 2, "\ud7ff": 3, "z": 4},
        {"a😀": 1, "a\uffff": 2, "a": 3, "a\U00010000b": 4},
        [{"k": {"\uffff": [1], "😀": {"\ufb01": 0, "\U0001d538": 1}}}],
    ]
    for value in values:
        got = await db.fetchval("SELECT agentledger_jcs($1::jsonb)", json.dumps(value))
        assert got.encode() == leaf.canonical_event(value), value  # type: ignore[arg-type]
    # Names drawn from both sides of the surrogate block, and from below it, in one object.
    rng = random.Random(8785)
    alphabet = ["a", "é", "\ud7ff", "\ue000", "\uffee", "\uffff", "😀", "\U00010000",
                "\U0010fffd", "\U0001d538"]
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(300)}
    mixed = {name: i for i, name in enumerate(sorted(names))}
    got = await db.fetchval("SELECT agentledger_jcs($1::jsonb)", json.dumps(mixed))
    assert got.encode() == leaf.canonical_event(mixed)
    # A number no double holds: the database still writes (a text of it), never fails.
    assert await db.fetchval("SELECT agentledger_jcs('[1e400, -1e-400]'::jsonb)") == \
        "[" + "1" + "0" * 400 + ",-0." + "0" * 399 + "1]"
    # The leaf hash (0051 writes the event's own members in place and sorts only the
    # payload's): every nullable column null and not, payloads flat, nested, empty and not
    # an object (a str is JSON text to event_object), a type and traceparent that need escaping.
    payloads: list[Any] = [{"n": [1.25, 2**55], "s": "x\ny"}, {}, [1, {"b": 2, "a": 1}], '"s"',
                           7.5, None, {"z": {"y": [0.1, 1e21]}, "é": "\u2028", "a": -0.0},
                           {"\uffff": 1, "😀": {"\ue000": 2, "\U0001f600": 3}, "b": 4}]
    for i, payload in enumerate(payloads):
        event = leaf.event_object(
            event_id=uuid.uuid4(), tenant_id=uuid.uuid4(),
            operation_id=uuid.uuid4() if i % 2 else None, type=["t", 'q"\n\u0001é'][i % 2],
            payload=payload, traceparent=None if i % 2 else f"00-{'a' * 32}-{'b' * 16}-01",
            recorded_at=datetime.now(UTC))
        in_db = await db.fetchval(
            "SELECT agentledger_audit_leaf_hash($1, $2, $3, $4, $5::jsonb, $6, $7)",
            uuid.UUID(event["event_id"]), uuid.UUID(event["tenant_id"]),
            None if event["operation_id"] is None else uuid.UUID(event["operation_id"]),
            event["type"], json.dumps(event["payload"]), event["traceparent"],
            datetime.strptime(event["recorded_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC))
        assert bytes(in_db) == leaf.leaf_hash(event), payload


async def test_two_tenants_appended_concurrently_verify(
        database_url: str, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        key_dir: Path) -> None:
    """Thousands of admissions per tenant, two tenants at once through the product's admission
    statement, while the notary sequences: both logs verify, every row is in its log once."""
    from agentledger.testing import ledger as test_ledger

    per_tenant, writers = 2000, 4
    tenants = [uuid.uuid4(), uuid.uuid4()]
    worker = notary.Notary(keys.load_signer(key_dir))
    done = asyncio.Event()

    async def sequence_meanwhile() -> int:
        n = 0
        while not done.is_set():
            n += await worker.cycle(notary_conn)
            await asyncio.sleep(0.05)  # the notary's interval, not a wait for a condition
        return n

    async def write(tenant: uuid.UUID, count: int) -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("SET ROLE agentledger_admission")
            for _ in range(count):
                await test_ledger.admit(conn, test_ledger.new_command(tenant, "crm"))
        finally:
            await conn.close()

    sequencer = asyncio.create_task(sequence_meanwhile())
    await asyncio.gather(*(write(t, per_tenant // writers) for t in tenants
                           for _ in range(writers)))
    done.set()
    during = await sequencer
    await notary.catch_up(notary_conn, worker)
    assert during > 0  # the notary sequenced while the writers wrote
    for t in tenants:
        report = await chain.verify_chain(auditor, t, trusted(key_dir))
        assert report.entries == per_tenant and report.unsequenced == 0
        assert report.checkpoints > 1


async def test_a_notary_batch_smaller_than_the_backlog_sequences_it_all_in_order(
        database_url: str, notary_conn: asyncpg.Connection, auditor: asyncpg.Connection,
        key_dir: Path) -> None:
    """A backlog larger than one cycle's batch is sequenced over several cycles, positions in
    seq order, one checkpoint per cycle, and the log verifies."""
    from agentledger.testing import ledger as test_ledger

    tenant = uuid.uuid4()
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SET ROLE agentledger_admission")
        for _ in range(25):
            await test_ledger.admit(conn, test_ledger.new_command(tenant, "crm"))
    finally:
        await conn.close()
    await notary.catch_up(notary_conn, notary.Notary(keys.load_signer(key_dir), batch=10))
    report = await chain.verify_chain(auditor, tenant, trusted(key_dir))
    assert (report.entries, report.unsequenced) == (25, 0)
    assert report.checkpoints >= 3
