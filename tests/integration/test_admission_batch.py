"""Admission of a batch of proposals in one transaction with set-based statements (issue 41 §2).

The proposals of one tenant that reach their transaction together are decided and admitted by
one principal read and one admitting statement; what that statement does not write (a
replay, a conflict, a budget without room for the batch) takes the per-row statements in the
same transaction, and a batch whose statement fails (a row's data refused, SQLSTATE class 22)
rolls back whole and runs each proposal alone, once. Asserted on the ledger's rows: commands,
obligations, audit events in order, decisions, budgets, approval requests.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from agentledger import admission, errors
from agentledger.contracts.proposals import PlannerInfo, ProposalV1
from agentledger.ledger import keys, repository
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities
from tests.integration.test_shadow_admission import MASTER

APP = "agentledger-batch-test"


PRINCIPALS_READ = "principal_id = ANY($2::text[])"  # policy/queries.sql lookup_principals
BATCH_ADMIT = "WITH ORDINALITY AS i(operation_id"  # ledger/admitbatch.sql admit_allowed_batch


class Sent:
    """Every statement the admission pool sends, and the SQLSTATE of each that failed."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.failed: list[str] = []

    def log(self, record: asyncpg.connection.LoggedQuery) -> None:
        text = " ".join(record.query.split())
        if not text.startswith(("BEGIN", "COMMIT", "ROLLBACK", "WITH RECURSIVE typeinfo_tree",
                                "SELECT current_setting('jit')", "SELECT set_config('jit'",
                                "RESET jit")):
            self.statements.append(text)
        if record.exception is not None:
            self.failed.append(getattr(record.exception, "sqlstate", "") or "")


@pytest.fixture
async def tenant(database_url: str) -> uuid.UUID:
    t = uuid.uuid4()
    await identities.put_principals(database_url, t, identities.DEFAULT_PRINCIPALS)
    return t


@pytest.fixture
async def sent_and_admitter(database_url: str, tenant: uuid.UUID
                            ) -> AsyncIterator[tuple[Sent, admission.Admitter]]:
    sent = Sent()

    async def as_admission(conn: asyncpg.Connection) -> None:
        await conn.execute("SET ROLE agentledger_admission")
        conn.add_query_logger(sent.log)

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4, init=as_admission,
                                     reset=repository.keep_session,
                                     server_settings={"application_name": APP})
    try:
        admitter = admission.Admitter(
            pool=pool, allowlist=allowlist.Allowlist.load(),
            resolver=MappingResolver({(tenant, "crm", "c-1"): "3",
                                      (tenant, "billing", "c-1"): "3"}),
            authorizer=policy_repo.CedarAuthorizer(), cipher=keys.PayloadCipher(MASTER),
            envelope_keys=identities.KEYSET, budget_limits={"tool_calls": 1})
        async with pool.acquire() as conn:
            await admitter.cipher.warm(conn, tenant)  # so a batch reaches its transaction together
        sent.statements.clear()
        yield sent, admitter
    finally:
        await pool.close()


def proposal(tenant: uuid.UUID, request_id: uuid.UUID, *, op: uuid.UUID | None = None,
             body: str = "called back", principal: str = "user:alice",
             action: str = "crm.note.create") -> ProposalV1:
    arguments: dict[str, Any] = {"customer_id": "c-1", "body": body}
    if action == "billing.refund.create":
        arguments = {"customer_id": "c-1", "invoice_id": "inv-1", "amount_minor": 1999,
                     "currency": "EUR", "reason": "late delivery"}
    return ProposalV1.model_validate(identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(tenant), "principal_id": principal,
        "operation_id": str(op or uuid.uuid4()), "action": action,
        "arguments": arguments, "target": "c-1", "planner": {"name": "scripted"},
        "created_at": datetime.now(UTC).isoformat()}, request_id=request_id))


async def _rows(conn: asyncpg.Connection, table: str, op: uuid.UUID) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {table} WHERE operation_id = $1", op))


async def _audit(conn: asyncpg.Connection, op: uuid.UUID) -> list[str]:
    # The command's own events (a replay whose request's budget is spent also records the
    # budget's refusal of its tool call, as the per-row path always has).
    return [r["type"] for r in await conn.fetch(
        "SELECT type FROM audit_event WHERE operation_id = $1 AND type LIKE 'command.%' "
        "ORDER BY seq", op)]


async def _used(conn: asyncpg.Connection, tenant: uuid.UUID, request: uuid.UUID) -> int:
    return int(await conn.fetchval(
        "SELECT coalesce(sum(used), 0) FROM budget WHERE tenant_id = $1 AND workflow_id = $2",
        tenant, str(request)))


async def test_new_commands_of_one_batch_cost_two_statements_in_all(
    sent_and_admitter: tuple[Sent, admission.Admitter], database_url: str, tenant: uuid.UUID,
) -> None:
    sent, admitter = sent_and_admitter
    requests = [uuid.uuid4() for _ in range(8)]
    proposals = [proposal(tenant, r) for r in requests]
    answers = await asyncio.gather(*(admitter.admit(p) for p in proposals))
    assert [a.status for a in answers] == ["admitted"] * 8
    stats = admitter.batches.stats
    assert (stats.batches, stats.batched_items, stats.alone, stats.fallbacks) == (1, 8, 0, 0)
    # One principal read (before Cedar) and one admitting statement for all eight.
    assert len(sent.statements) == 2, sent.statements
    assert PRINCIPALS_READ in sent.statements[0] and BATCH_ADMIT in sent.statements[1]
    admin = await asyncpg.connect(database_url)
    try:
        for p, r in zip(proposals, requests, strict=True):
            op = p.operation_id
            assert [await _rows(admin, t, op) for t in (
                "agent_command", "command_outbox", "policy_decision", "budget_reservation")
            ] == [1, 1, 1, 1]
            assert await _audit(admin, op) == ["command.admitted"]
            assert await _used(admin, tenant, r) == 1
        # The audit copy keeps the batch's order: one statement, rows in proposal order.
        seqs = [await admin.fetchval("SELECT seq FROM audit_event WHERE operation_id = $1",
                                     p.operation_id) for p in proposals]
        assert seqs == sorted(seqs)
    finally:
        await admin.close()


async def test_a_batch_mixing_new_replays_refusals_approvals_and_a_denial(
    sent_and_admitter: tuple[Sent, admission.Admitter], database_url: str, tenant: uuid.UUID,
) -> None:
    sent, admitter = sent_and_admitter
    old_request, r1, r2, r3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    old = proposal(tenant, old_request)
    assert (await admitter.admit(old)).status == "admitted"  # an earlier batch's command
    sent.statements.clear()
    two_a, two_b = proposal(tenant, r2), proposal(tenant, r2)  # r2's budget holds one of them
    proposals = [
        proposal(tenant, r1),                                        # new: admitted
        old,                                                         # redelivered: replayed
        proposal(tenant, old_request, op=old.operation_id, body="x"),  # other content: conflict
        two_a, two_b,                     # one request, no room for both: per row, exactly one
        proposal(tenant, r3, action="billing.refund.create"),        # approval required
        proposal(tenant, uuid.uuid4(), principal="user:nobody"),     # unknown principal: denied
    ]
    answers = await asyncio.gather(*(admitter.admit(p) for p in proposals))
    got = [(a.status, a.reason_code) for a in answers]
    assert got[:3] == [("admitted", None), ("replayed", None),
                       ("conflict", "idempotency_conflict")]
    assert sorted(got[3:5], key=str) == [("admitted", None), ("rejected", "budget_exhausted")]
    assert got[5:] == [("pending_approval", None), ("rejected", "policy_denied")]
    stats = admitter.batches.stats
    assert (stats.batches, stats.batched_items, stats.fallbacks) == (1, 7, 0)
    assert sum(BATCH_ADMIT in s for s in sent.statements) == 1
    assert sum(PRINCIPALS_READ in s for s in sent.statements) == 1
    admin = await asyncpg.connect(database_url)
    try:
        new = proposals[0].operation_id
        assert [await _rows(admin, t, new) for t in ("agent_command", "command_outbox")] == [1, 1]
        assert await _audit(admin, new) == ["command.admitted"]
        # The old command: still one, its obligation once; the replay and the conflict audited.
        assert [await _rows(admin, t, old.operation_id)
                for t in ("agent_command", "command_outbox")] == [1, 1]
        assert await _audit(admin, old.operation_id) == [
            "command.admitted", "command.replayed", "command.conflict"]
        assert await _used(admin, tenant, old_request) == 1  # the replay spent nothing
        admitted_b = [p.operation_id for p, a in zip((two_a, two_b), answers[3:5], strict=True)
                      if a.status == "admitted"]
        refused_b = {two_a.operation_id, two_b.operation_id} - set(admitted_b)
        assert await _used(admin, tenant, r2) == 1
        assert await _rows(admin, "agent_command", admitted_b[0]) == 1
        assert await _rows(admin, "agent_command", refused_b.pop()) == 0
        refund = proposals[5].operation_id
        assert await _rows(admin, "agent_command", refund) == 0
        assert await admin.fetchval("SELECT state FROM approval_request WHERE operation_id = $1",
                                    refund) == "pending"
        denied = proposals[6].operation_id
        assert await _rows(admin, "agent_command", denied) == 0
        assert await admin.fetchval(
            "SELECT effect FROM policy_decision WHERE operation_id = $1", denied) == "deny"
    finally:
        await admin.close()


async def test_a_poison_row_fails_alone_and_the_rest_of_its_batch_is_admitted_once(
    sent_and_admitter: tuple[Sent, admission.Admitter], database_url: str, tenant: uuid.UUID,
) -> None:
    sent, admitter = sent_and_admitter
    requests = [uuid.uuid4() for _ in range(4)]
    good = [proposal(tenant, r) for r in requests]
    # Text the ledger cannot store (U+0000 in the audit's planner model), past the contract's
    # check as a row that slipped through it: the batch's statement is refused (22P05).
    poison = proposal(tenant, uuid.uuid4()).model_copy(
        update={"planner": PlannerInfo.model_construct(name="scripted", model="m\x00")})
    answers = await asyncio.gather(*(admitter.admit(p) for p in (*good[:2], poison, *good[2:])),
                                   return_exceptions=True)
    assert isinstance(answers[2], errors.DataRejected)
    assert not answers[2].retryable
    assert [a.status for a in (*answers[:2], *answers[3:])
            if isinstance(a, admission.AdmissionResultV1)] == ["admitted"] * 4
    stats = admitter.batches.stats
    assert (stats.batches, stats.fallbacks, stats.alone) == (0, 1, 5)
    # The refusal was met twice: by the batch's statement, then by the poison row's own
    # statement alone — never a third time (a class 22 error is not retried).
    assert [s for s in sent.failed if s[:2] == "22"] == ["22P05", "22P05"]
    admin = await asyncpg.connect(database_url)
    try:
        for p, r in zip(good, requests, strict=True):
            assert [await _rows(admin, t, p.operation_id) for t in (
                "agent_command", "command_outbox", "policy_decision")] == [1, 1, 1]
            assert await _audit(admin, p.operation_id) == ["command.admitted"]
            assert await _used(admin, tenant, r) == 1
        assert await _rows(admin, "agent_command", poison.operation_id) == 0
        assert await _audit(admin, poison.operation_id) == []
    finally:
        await admin.close()
