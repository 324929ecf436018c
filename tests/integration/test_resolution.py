"""Operator resolutions an auditor can trust (issue 18 §3), through `agentledger reconcile resolve`.

`reconcile resolve --by user:not-in-any-directory --receipt anything` was accepted and recorded
as given. The resolver is now the verified session's principal, a current operator in the
principal directory; the outcome is checked with the connector's lookup where it has one
(confirmed, or refused when the provider contradicts it or cannot answer) and recorded as
unchecked where it has none. Every check reads the ledger, the audit ledger and the CRM.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from click.testing import Result
from typer.testing import CliRunner

from agentledger import cli, identity
from agentledger.policy import repository as policy_repo
from agentledger.testing import identities
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World

NOTE = "crm.note.create"
REFUND = "billing.refund.create"
OPERATOR = identities.OPERATOR


crm, world = executor_world.fixtures()


async def tenant(world: World) -> Tenant:
    """A tenant whose directory holds the test operator (and the usual principals)."""
    t = await world.tenant()
    async with world.owner.acquire() as conn:
        await policy_repo.put_principal(conn, t.tenant_id, OPERATOR, ["agent-operator"])
    return t


def resolve(world: World, database_url: str, op: uuid.UUID, token: str | None, *args: str) -> Result:
    """`agentledger reconcile resolve` as an operator's shell runs it (in this process)."""
    env = {**identities.operator_env(database_url, world.crm.url, world.lookup_tokens),
           "AGENTLEDGER_TOKEN": None}
    signed = [] if token is None else ["--token", token]
    return CliRunner().invoke(cli.app, ["reconcile", "resolve", str(op), *signed, *args], env=env)


async def run_resolve(world: World, database_url: str, op: uuid.UUID, token: str | None,
                      *args: str) -> Result:
    # The command runs its own event loop, so it runs in a thread here.
    return await asyncio.to_thread(resolve, world, database_url, op, token, *args)


async def lost_refund(world: World, t: Tenant) -> uuid.UUID:
    """A refund (contract none) the CRM made and whose answer was lost: `unknown`, one effect."""
    op = await world.admit(t, REFUND, {"invoice_id": f"inv-{uuid.uuid4().hex[:6]}", "amount_minor": 900,
                                       "currency": "EUR", "reason": "double charge"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "drop_after_commit", "times": 1})
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "unknown"
    return op


async def lost_note(world: World, t: Tenant) -> uuid.UUID:
    """A note (keyed, with lookup) the CRM made, every answer lost: `unknown`, one effect."""
    op = await world.admit(t, NOTE, {"body": f"note {uuid.uuid4().hex[:6]}"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "drop_after_commit", "times": 10})
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "unknown"
    await world.crm.disarm()
    return op


async def failed_note(world: World, t: Tenant) -> uuid.UUID:
    """A note every send of which the CRM rolled back (503): `unknown`, no effect."""
    op = await world.admit(t, NOTE, {"body": f"note {uuid.uuid4().hex[:6]}"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "fail_before_commit", "times": None})
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "unknown"
    await world.crm.disarm()
    return op


async def recorded(world: World, op: uuid.UUID) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(resolution rows, `command.reconciled` audit payloads) of one operation."""
    async with world.owner.acquire() as conn:
        rows = [dict(r) for r in await conn.fetch(
            "SELECT resolved_by, outcome, receipt, reason, evidence FROM command_resolution "
            "WHERE operation_id = $1", op)]
        events = [json.loads(p) for p in await conn.fetchval(
            "SELECT coalesce(array_agg(payload::text ORDER BY seq), '{}') FROM audit_event "
            "WHERE operation_id = $1 AND type = 'command.reconciled'", op)]
    return rows, events


async def assert_nothing_recorded(world: World, t: Tenant, op: uuid.UUID) -> None:
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("unknown", None), dict(row)
    assert await recorded(world, op) == ([], [])


async def note_receipt(world: World, t: Tenant, op: uuid.UUID) -> str:
    """The receipt of a note as the CRM itself recorded the answer under the key."""
    async with world.crm.client(t.lookup) as c:
        answer = (await c.get(f"/v1/operations/{op}")).json()
    return f"crm:note:{answer['response']['note_id']}"


# ---- who resolves ------------------------------------------------------------------------


async def _not_in_directory(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> tuple[str, list[str]]:
    return "user:not-in-any-directory", ["agent-operator"]


async def _revoked(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> tuple[str, list[str]]:
    await policy_repo.put_principal(conn, tenant_id, "ops:rita", ["agent-operator"])
    assert await policy_repo.revoke_principal(conn, tenant_id, "ops:rita")
    return "ops:rita", ["agent-operator"]


async def _no_operating_role(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> tuple[str, list[str]]:
    # The token claims the role; the directory, which decides, does not grant it.
    await policy_repo.put_principal(conn, tenant_id, "user:ursula", ["user", "approver"])
    return "user:ursula", ["agent-operator"]


async def _claims_no_operating_role(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> tuple[str, list[str]]:
    return OPERATOR, ["user"]


@pytest.mark.parametrize("who", [_not_in_directory, _revoked, _no_operating_role, _claims_no_operating_role],
                         ids=["not-in-the-directory", "revoked", "no-operating-role", "token-claims-no-operating-role"])
async def test_a_resolver_who_is_not_a_current_operator_is_refused_and_nothing_is_recorded(
    world: World, database_url: str, who: Callable[[asyncpg.Connection, uuid.UUID], Any],
) -> None:
    t = await tenant(world)
    op = await lost_refund(world, t)
    async with world.owner.acquire() as conn:
        principal, roles = await who(conn, t.tenant_id)
    done = await run_resolve(world, database_url, op,
                             identities.session_token(t.tenant_id, principal, roles),
                             "--outcome", "succeeded", "--receipt", "anything", "--reason", "trust me")
    assert done.exit_code == 2 and "not_an_operator" in done.output, done.output
    await assert_nothing_recorded(world, t, op)


async def test_a_token_that_does_not_verify_is_refused_and_nothing_is_recorded(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await lost_refund(world, t)
    forger, _ = identity.generate_keypair("EdDSA")
    tokens = {
        "forged": identities.session_token(t.tenant_id, OPERATOR, private_pem=forger),
        "another tenant's": identities.session_token(uuid.uuid4(), OPERATOR),
        "none": "",
    }
    for name, token in tokens.items():
        done = await run_resolve(world, database_url, op, token, "--tenant", str(t.tenant_id),
                                 "--outcome", "failed", "--reason", "trust me")
        assert done.exit_code == 2 and "identity_rejected" in done.output, (name, done.output)
    await assert_nothing_recorded(world, t, op)


async def test_the_resolver_is_the_session_never_a_name_on_the_command_line(
    world: World, database_url: str,
) -> None:
    # The command of issue 18 §3, accepted and recorded as given until now.
    t = await tenant(world)
    op = await lost_refund(world, t)
    typed = await run_resolve(world, database_url, op, None, "--tenant", str(t.tenant_id),
                              "--outcome", "succeeded", "--by", "user:not-in-any-directory",
                              "--receipt", "anything", "--reason", "trust me")
    assert typed.exit_code == 2 and "--by" in typed.output, typed.output  # the option is gone
    await assert_nothing_recorded(world, t, op)
    # Without a session token nothing is resolved at all, whoever the shell claims to be.
    unsigned = await run_resolve(world, database_url, op, None, "--tenant", str(t.tenant_id),
                                 "--outcome", "failed", "--reason", "trust me")
    assert unsigned.exit_code == 2 and "identity_rejected" in unsigned.output, unsigned.output
    await assert_nothing_recorded(world, t, op)


# ---- what is recorded --------------------------------------------------------------------


async def test_a_refund_without_lookup_is_recorded_as_the_operators_unchecked_word(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await lost_refund(world, t)
    effect = (await world.effects(t, "refund.created"))[-1]
    done = await run_resolve(world, database_url, op, identities.session_token(t.tenant_id, OPERATOR),
                             "--tenant", str(t.tenant_id), "--outcome", "succeeded",
                             "--receipt", f"crm:effect:{effect['effect_id']}",
                             "--reason", "found in the CRM effect log", "--evidence", "GET /admin/effects")
    assert done.exit_code == 0, done.output
    assert "unchecked" in done.output and OPERATOR in done.output
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("succeeded", f"crm:effect:{effect['effect_id']}")
    (resolution,), (event,) = await recorded(world, op)
    assert resolution["resolved_by"] == OPERATOR and resolution["evidence"] == "GET /admin/effects"
    assert resolution["reason"].startswith("[unchecked: connector billing declares no lookup"), resolution
    assert row["outcome_reason"] == resolution["reason"]
    assert (event["resolved_by"], event["receipt_check"]) == (OPERATOR, "unchecked"), event
    assert "no lookup" in event["check_detail"]


async def test_a_receipt_the_lookup_contradicts_is_refused_and_the_one_it_finds_is_confirmed(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await lost_note(world, t)
    assert len(await world.effects(t, "note.created")) == 1
    token = identities.session_token(t.tenant_id, OPERATOR)
    forged = await run_resolve(world, database_url, op, token, "--outcome", "succeeded",
                               "--receipt", "crm:note:anything", "--reason", "trust me", "--allow-unchecked")
    assert forged.exit_code == 2 and "receipt_contradicted" in forged.output, forged.output
    denied = await run_resolve(world, database_url, op, token, "--outcome", "failed",
                               "--reason", "nothing happened", "--allow-unchecked")
    assert denied.exit_code == 2 and "receipt_contradicted" in denied.output, denied.output
    await assert_nothing_recorded(world, t, op)

    receipt = await note_receipt(world, t, op)
    done = await run_resolve(world, database_url, op, token, "--outcome", "succeeded",
                             "--receipt", receipt, "--reason", "the note is there")
    assert done.exit_code == 0, done.output
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("succeeded", receipt)
    (resolution,), (event,) = await recorded(world, op)
    assert resolution["resolved_by"] == OPERATOR and resolution["reason"].startswith("[confirmed: "), resolution
    assert (event["receipt_check"], event["receipt"]) == ("confirmed", receipt), event
    assert len(await world.effects(t, "note.created")) == 1  # a resolution never calls a write API


async def test_a_success_the_lookup_cannot_find_is_refused_and_the_failure_it_proves_is_confirmed(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await failed_note(world, t)
    token = identities.session_token(t.tenant_id, OPERATOR)
    claimed = await run_resolve(world, database_url, op, token, "--outcome", "succeeded",
                                "--receipt", "crm:note:123", "--reason", "I saw it", "--allow-unchecked")
    assert claimed.exit_code == 2 and "receipt_contradicted" in claimed.output, claimed.output
    await assert_nothing_recorded(world, t, op)

    done = await run_resolve(world, database_url, op, token, "--outcome", "failed",
                             "--reason", "the CRM rolled every send back")
    assert done.exit_code == 0, done.output
    assert (await world.row(t, op))["state"] == "failed"
    (resolution,), (event,) = await recorded(world, op)
    assert event["receipt_check"] == "confirmed" and "no effect" in event["check_detail"], event
    assert resolution["reason"].startswith("[confirmed: "), resolution
    assert await world.effects(t, "note.created") == []


async def test_a_lookup_that_cannot_answer_refuses_unless_recorded_unchecked_explicitly(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await failed_note(world, t)
    token = identities.session_token(t.tenant_id, OPERATOR)
    # The CRM closes every lookup's connection unanswered (a provider down, from outside).
    await world.crm.arm({"match": {"method": "GET", "path_prefix": "/v1/operations/"},
                         "action": "drop_after_commit", "times": None})
    refused = await run_resolve(world, database_url, op, token, "--outcome", "failed",
                                "--reason", "the CRM is down; finance says no note")
    assert refused.exit_code == 2 and "receipt_unverifiable" in refused.output, refused.output
    await assert_nothing_recorded(world, t, op)

    done = await run_resolve(world, database_url, op, token, "--outcome", "failed",
                             "--reason", "the CRM is down; finance says no note", "--allow-unchecked")
    assert done.exit_code == 0, done.output
    (resolution,), (event,) = await recorded(world, op)
    assert event["receipt_check"] == "unchecked", event
    assert "recorded unchecked by the operator" in event["check_detail"], event
    assert "lookup failed" in event["check_detail"], event
    assert resolution["reason"].startswith("[unchecked: recorded unchecked by the operator"), resolution
