"""Admission's half of "shadow runs never write" (R9.2), tested on its own.

First the library (``Admitter`` on the real ledger, admission's role): a validly signed,
otherwise admissible shadow proposal is refused before policy and writes nothing but the
audit of its refusal. Then the service as a subprocess: shadow proposals injected straight
onto its proposals topic are never admitted, and so never reach the executor, which loads
commands from the ledger only (R1.6).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from agentledger import admission, crypto
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import keys
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities
from tests.integration.test_admission_service import World, proposal, world  # noqa: F401 - fixture

TENANT = uuid.uuid4()
# One master key for the module: the tenant's data key, once wrapped, must unwrap again.
MASTER = crypto.MasterKey(os.urandom(32))


async def count(url: str, table: str, operation_id: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table} WHERE operation_id = $1",
                                       uuid.UUID(operation_id)))
    finally:
        await conn.close()


@pytest.fixture
async def admitter(database_url: str) -> AsyncIterator[admission.Admitter]:
    await identities.put_principals(database_url, TENANT, identities.DEFAULT_PRINCIPALS)

    async def as_admission(conn: asyncpg.Connection) -> None:
        await conn.execute("SET ROLE agentledger_admission")

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2, init=as_admission)
    try:
        yield admission.Admitter(
            pool=pool, allowlist=allowlist.Allowlist.load(),
            resolver=MappingResolver({(TENANT, c, "c-1"): "3" for c in ("crm", "billing")}),
            authorizer=policy_repo.CedarAuthorizer(),
            cipher=keys.PayloadCipher(MASTER),
            envelope_keys=identities.KEYSET)
    finally:
        await pool.close()


def signed(action: str, arguments: dict[str, Any], *, shadow: bool, operation_id: str | None = None) -> ProposalV1:
    body = identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()), "tenant_id": str(TENANT),
        "principal_id": "user:alice", "operation_id": operation_id or str(uuid.uuid4()), "action": action,
        "arguments": {"customer_id": "c-1", **arguments}, "target": "c-1",
        "planner": {"name": "candidate"}, "created_at": datetime.now(UTC).isoformat()})
    return ProposalV1.model_validate_json(json.dumps({**body, "shadow": shadow}))


@pytest.mark.parametrize(("action", "arguments"), [
    ("crm.note.create", {"body": "would be auto-approved"}),
    ("billing.refund.create", {"invoice_id": "INV-1", "amount_minor": 2500, "currency": "EUR",
                               "reason": "would wait for a person"}),
])
async def test_admitter_refuses_a_signed_shadow_proposal_and_writes_only_its_audit(
    admitter: admission.Admitter, database_url: str, action: str, arguments: dict[str, Any],
) -> None:
    shadowed = signed(action, arguments, shadow=True)
    result = await admitter.admit(shadowed)
    assert (result.status, result.reason_code) == ("rejected", "shadow_refused")
    op = str(shadowed.operation_id)
    for table in ("agent_command", "command_outbox", "approval_request", "policy_decision"):
        assert await count(database_url, table, op) == 0, table
    conn = await asyncpg.connect(database_url)
    try:
        audited = await conn.fetch("SELECT payload FROM audit_event WHERE operation_id = $1 "
                                   "AND type = 'proposal.rejected'", shadowed.operation_id)
    finally:
        await conn.close()
    assert [json.loads(a["payload"])["code"] for a in audited] == ["shadow_refused"]

    # The control: the very same proposal, not shadow, is admissible (or goes to a person).
    plain = signed(action, arguments, shadow=False, operation_id=op)
    assert (await admitter.admit(plain)).status in ("admitted", "pending_approval")


async def test_shadow_proposals_injected_onto_the_topic_are_never_admitted(world: World) -> None:  # noqa: F811
    injected = [
        proposal(world, shadow=True),  # a note: auto-approved and dispatched were it not shadow
        proposal(world, shadow=True, action="billing.refund.create",
                 arguments={"customer_id": "cust-a", "invoice_id": "INV-9", "amount_minor": 1_000_000,
                            "currency": "EUR", "reason": "shadow"}),
        proposal(world, tenant_index=1, shadow=True),
    ]
    for p in injected:
        world.send(p)
    control = proposal(world)  # same partition key, sent after: processed after them
    world.send(control)
    assert world.result_for(control["proposal_id"])["status"] == "admitted"
    for p in injected:
        result = world.result_for(p["proposal_id"])
        assert (result["status"], result["reason_code"]) == ("rejected", "shadow_refused"), result
        for table in ("agent_command", "command_outbox", "approval_request", "policy_decision"):
            # No ledger row and no dispatch obligation: nothing an executor could ever load.
            assert await count(world.database_url, table, p["operation_id"]) == 0, table
