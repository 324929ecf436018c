"""Signed checkpoints are published on the audit topic (issue 43): the notary writes each one
to the outbox in the transaction that stores it, the relay publishes it on
``audit.events.v1`` (type ``log.checkpoint``, keyed by tenant), and what a consumer receives
verifies with the notary's JWKS and is the checkpoint the ledger stores. It is not copied
into ``audit_event``: a checkpoint is about the log, not in it."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import asyncpg
from confluent_kafka.admin import AdminClient

from agentledger.evidence import checkpoint, keys, notary
from agentledger.testing import ledger
from tests.integration.relay import support


async def _notarize(url: str, key_dir: Path) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SET ROLE agentledger_notary")
        await notary.catch_up(conn, notary.Notary(keys.load_signer(key_dir)))
        await conn.execute("RESET ROLE")
        return list(await conn.fetch(
            "SELECT tenant_id, tree_size, body, signature FROM audit_checkpoint"))
    finally:
        await conn.close()


def test_a_signed_checkpoint_reaches_the_audit_topic_and_verifies(
        relay: support.Relay, kafka_admin: AdminClient, tmp_path: Path) -> None:
    tenant = uuid.uuid4()
    writer = ledger.Ledger(relay.database_url)
    try:
        for _ in range(3):
            writer.admit(ledger.new_command(tenant, "crm"))
    finally:
        writer.close()
    keys.generate(tmp_path / "keys")
    stored = asyncio.run(_notarize(relay.database_url, tmp_path / "keys"))
    assert [(r["tenant_id"], r["tree_size"]) for r in stored] == [(tenant, 3)]
    relay.start()
    topic = f"{relay.namespace}audit.events.v1"
    support.wait_for_topics(kafka_admin, [topic])
    received = support.read_topics(
        relay.bootstrap, [topic],
        lambda got: any(r.header("type") == "log.checkpoint" for r in got), timeout=90)
    received = list({r.header("id"): r for r in received}.values())  # at least once: dedupe
    published = [r for r in received if r.header("type") == "log.checkpoint"]
    assert len(published) == 1 and published[0].key == str(tenant)
    value = json.loads(published[0].value)
    trusted = {keys.key_id(k): k for k in keys.public_keys(tmp_path / "keys")}
    cp = checkpoint.verify(value["body"], bytes.fromhex(value["signature"]), trusted)
    assert (cp.tenant_id, cp.tree_size, cp.body) == (str(tenant), 3, stored[0]["body"])
    assert bytes(stored[0]["signature"]) == bytes.fromhex(value["signature"])
    # three command.admitted audit events and the checkpoint: the checkpoint is no leaf
    assert sorted(r.header("type") for r in received) == ["command.admitted"] * 3 + [
        "log.checkpoint"]

    async def leaves() -> int:
        conn = await asyncpg.connect(relay.database_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM audit_event "
                                           "WHERE tenant_id = $1", tenant))
        finally:
            await conn.close()

    assert asyncio.run(leaves()) == 3
