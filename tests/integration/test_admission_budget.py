"""A request's tool-call budget stays exact through admission (R7.2), crashes included.

Admission opens and reserves the budget, admits, records the decision and settles the
reservation in one transaction: a connection lost before its commit leaves no reservation
behind (a reservation committed on its own before the admission, released afterwards on the
same connection, stayed reserved forever when that connection was gone), and the retry of
the same proposal spends the one tool call the budget holds. A redelivery after that is a
replay, not a budget refusal: its command exists and runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from agentledger import admission, errors, faults
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import groupcommit, keys
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities
from tests.integration.test_shadow_admission import MASTER, TENANT

APP = "agentledger-budget-test"


@pytest.fixture
async def admitter(database_url: str) -> AsyncIterator[admission.Admitter]:
    await identities.put_principals(database_url, TENANT, identities.DEFAULT_PRINCIPALS)

    async def as_admission(conn: asyncpg.Connection) -> None:
        await conn.execute("SET ROLE agentledger_admission")

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2, init=as_admission,
                                     server_settings={"application_name": APP})
    try:
        yield admission.Admitter(
            pool=pool, allowlist=allowlist.Allowlist.load(),
            resolver=MappingResolver({(TENANT, "crm", "c-1"): "3"}),
            authorizer=policy_repo.CedarAuthorizer(), cipher=keys.PayloadCipher(MASTER),
            envelope_keys=identities.KEYSET, budget_limits={"tool_calls": 1})
    finally:
        await pool.close()


def note(request_id: uuid.UUID) -> ProposalV1:
    return ProposalV1.model_validate(identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(TENANT), "principal_id": "user:alice",
        "operation_id": str(uuid.uuid4()), "action": "crm.note.create",
        "arguments": {"customer_id": "c-1", "body": "called back"}, "target": "c-1",
        "planner": {"name": "scripted"}, "created_at": datetime.now(UTC).isoformat()},
        request_id=request_id))


async def _budget(conn: asyncpg.Connection, workflow: str) -> tuple[int, int, list[str]]:
    row = await conn.fetchrow("SELECT coalesce(sum(reserved), 0) AS reserved, "
                              "coalesce(sum(used), 0) AS used FROM budget "
                              "WHERE tenant_id = $1 AND workflow_id = $2", TENANT, workflow)
    states = await conn.fetch("SELECT state FROM budget_reservation WHERE tenant_id = $1 AND "
                              "workflow_id = $2 ORDER BY created_at", TENANT, workflow)
    return int(row["reserved"]), int(row["used"]), [s["state"] for s in states]


async def test_a_connection_lost_before_commit_leaves_no_reservation_and_the_retry_spends_it(
    admitter: admission.Admitter, database_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = uuid.uuid4()
    proposal = note(request)
    admin = await asyncpg.connect(database_url)
    real = faults.point
    cut: list[int] = []

    async def lose_the_connection(name: str) -> None:
        # At the last point before COMMIT, the admitting session (idle in its transaction)
        # is terminated, as a crashed process or a dropped network would end it.
        if name == "admission.before_commit" and not cut:
            cut.extend(await admin.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                "application_name = $1 AND state = 'idle in transaction'", APP))
        await real(name)

    monkeypatch.setattr(faults, "point", lose_the_connection)
    try:
        with pytest.raises(errors.StorageError):
            await admitter.admit(proposal)
        assert len(cut) == 1  # exactly the admitting session was cut
        workflow = str(request)
        assert await _budget(admin, workflow) == (0, 0, [])
        assert await admin.fetchval("SELECT count(*) FROM agent_command WHERE operation_id = $1",
                                    proposal.operation_id) == 0

        # The retry (the record redelivered) admits and spends the budget's one tool call…
        first = await admitter.admit(proposal)
        assert (first.status, first.state) == ("admitted", "pending")
        assert await _budget(admin, workflow) == (0, 1, ["committed"])
        # …and its redelivery, with the budget now spent, is answered as the replay it is
        # (not refused: the command exists and runs), spending nothing.
        again = await admitter.admit(proposal)
        assert (again.status, again.state) == ("replayed", "pending")
        assert await _budget(admin, workflow) == (0, 1, ["committed"])
        assert [r["type"] for r in await admin.fetch(
            "SELECT type FROM audit_event WHERE operation_id = $1 AND type LIKE 'command.%' "
            "ORDER BY seq", proposal.operation_id)] == ["command.admitted", "command.replayed"]
        assert await admin.fetchval("SELECT count(*) FROM agent_command WHERE operation_id = $1",
                                    proposal.operation_id) == 1
    finally:
        await admin.close()


def signed(request_id: uuid.UUID, operation_id: uuid.UUID, body: str,
           principal: str = "user:alice") -> ProposalV1:
    return ProposalV1.model_validate(identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(TENANT), "principal_id": principal,
        "operation_id": str(operation_id), "action": "crm.note.create",
        "arguments": {"customer_id": "c-1", "body": body}, "target": "c-1",
        "planner": {"name": "scripted"}, "created_at": datetime.now(UTC).isoformat()},
        request_id=request_id))


async def test_proposals_admitted_in_one_group_commit_each_get_their_own_answer(
    admitter: admission.Admitter, database_url: str,
) -> None:
    # Issue 20 §2: the admissions of one batch share a COMMIT. A budget refusal, a denial, a
    # replay and a conflict in the group change nothing of the others'; the budget stays
    # exact; two proposals with one operation id give one admission and one replay.
    admitter = dataclasses.replace(
        admitter, group=groupcommit.GroupCommit(admitter.pool, leaders=1))
    async with admitter.pool.acquire() as conn:
        await admitter.cipher.warm(conn, TENANT)  # so all five reach the group together
    r, s = uuid.uuid4(), uuid.uuid4()
    op1, op2, op3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    again = signed(s, op3, "called back")
    proposals = [
        signed(r, op1, "called back"),                      # admitted: R's one tool call
        signed(r, op2, "called back"),                      # R's budget is spent: refused
        again,                                              # admitted: S's one tool call
        again,                                              # the same proposal: replayed
        signed(s, op3, "a different note"),                 # op3 with other content: conflict
        signed(s, uuid.uuid4(), "x", principal="user:nobody"),  # unknown principal: denied
    ]
    answers = await asyncio.gather(*(admitter.admit(p) for p in proposals))
    assert [(a.status, a.reason_code) for a in answers] == [
        ("admitted", None), ("rejected", "budget_exhausted"), ("admitted", None),
        ("replayed", None), ("conflict", "idempotency_conflict"), ("rejected", "policy_denied")]
    # Issue 41 §2: the six are one batch (one transaction, set-based), none fell back.
    assert (admitter.batches.stats.batches, admitter.batches.stats.batched_items,
            admitter.batches.stats.fallbacks) == (1, 6, 0)
    admin = await asyncpg.connect(database_url)
    try:
        commands = await admin.fetch("SELECT operation_id FROM agent_command WHERE tenant_id = $1",
                                     TENANT)
        assert {c["operation_id"] for c in commands} >= {op1, op3}
        assert op2 not in {c["operation_id"] for c in commands}
        assert await _budget(admin, str(r)) == (0, 1, ["committed"])  # one, spent
        assert (await _budget(admin, str(s)))[:2] == (0, 1)
    finally:
        await admin.close()
