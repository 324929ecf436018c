"""The executor's half of "shadow runs never write" (R9.2), tested on its own.

Admission never admits a shadow proposal, so the shadow command here is written straight to
the ledger (``repository.admit``, then the owner sets the flag): what the executor must do
with one that got there by any other way. Real CRM process, real ledger, executor role.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentledger import canonical
from agentledger.connectors import base
from agentledger.ledger import dispatch, keys, repository
from agentledger.testing.crm import Crm, run_crm
from tests.integration.executor_world import RULES, Tenant, World, close_world, open_world


class Spy:
    """The real connector, with every call counted."""

    def __init__(self, real: base.Connector) -> None:
        self.real = real
        self.name, self.actions = real.name, real.actions
        self.contract, self.scopes = real.contract, real.scopes
        self.calls = 0

    async def execute(self, call: base.Call, token: str) -> base.Result:
        self.calls += 1
        return await self.real.execute(call, token)

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        self.calls += 1
        return await self.real.lookup(call, token)

    async def aclose(self) -> None:
        await self.real.aclose()


@pytest.fixture(scope="module")
def crm(make_database: Callable[[], str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crm]:
    with run_crm(make_database(), tmp_path_factory.mktemp("crm")) as c:
        yield c


@pytest.fixture
async def world(crm: Crm, database_url: str) -> AsyncIterator[World]:
    w = await open_world(crm, database_url)
    w.connectors = {name: Spy(c) for name, c in w.connectors.items()}
    yield w
    await close_world(w)


async def insert_command(w: World, t: Tenant, *, shadow: bool) -> uuid.UUID:
    """A command written to the ledger directly (no admission), optionally marked shadow."""
    op = uuid.uuid4()
    arguments = {"customer_id": t.customer_id, "body": f"shadow={shadow}"}
    async with w.admission_pool.acquire() as conn:
        ciphertext, version = await keys.PayloadCipher(w.master).encrypt(
            conn, t.tenant_id, op, canonical.canonical_bytes(arguments))
        result = await repository.admit(conn, repository.NewCommand(
            tenant_id=t.tenant_id, operation_id=op,
            request_hash=hashlib.sha256(json.dumps(arguments).encode()).digest(),
            principal_id="user:alice", action="crm.note.create", connector="crm",
            resource_id=t.customer_id, expected_revision=None, decision_id=uuid.uuid4(),
            policy_version="cedar/sha256:test", allowlist_version=RULES.version,
            expires_at=datetime.now(UTC) + timedelta(minutes=15),
            payload_ciphertext=ciphertext, payload_key_version=version))
    assert result.status == "admitted"
    if shadow:
        async with w.owner.acquire() as conn:
            await conn.execute("UPDATE agent_command SET shadow = true "
                               "WHERE tenant_id = $1 AND operation_id = $2", t.tenant_id, op)
    return op


async def test_a_shadow_command_is_denied_at_dispatch_with_zero_connector_calls(world: World) -> None:
    t = await world.tenant()
    spy = world.connectors["crm"]
    assert isinstance(spy, Spy)
    op = await insert_command(world, t, shadow=True)

    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "denied"

    assert spy.calls == 0
    assert await world.effects(t) == []
    row = await world.row(t, op)
    assert (row["state"], row["shadow"], row["provider_receipt"]) == ("denied", True, None)
    assert "shadow" in row["outcome_reason"]
    # A redelivery finds it terminal: still nothing sent.
    assert (await worker.begin(t.tenant_id, op)).disposition == "terminal"
    assert spy.calls == 0
    async with world.owner.acquire() as conn:
        attempts = await dispatch.attempts(conn, t.tenant_id, op)
    assert [a["result"] for a in attempts] == ["denied"]


async def test_the_same_command_unmarked_is_dispatched(world: World) -> None:
    # The control: the refusal above is the flag's doing, not the command's.
    t = await world.tenant()
    spy = world.connectors["crm"]
    assert isinstance(spy, Spy)
    op = await insert_command(world, t, shadow=False)
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"
    assert spy.calls == 1
    assert len(await world.effects(t, "note.created")) == 1


async def test_no_service_role_can_clear_the_flag(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await insert_command(world, t, shadow=True)
    for role in ("agentledger_executor", "agentledger_reconciler", "agentledger_admission"):
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(f"SET ROLE {role}")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("UPDATE agent_command SET shadow = false "
                                   "WHERE tenant_id = $1 AND operation_id = $2", t.tenant_id, op)
        finally:
            await conn.close()
    assert (await world.row(t, op))["shadow"] is True
