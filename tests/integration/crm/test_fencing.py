"""Fencing tokens (issue 18 §1): per (tenant, key) the CRM keeps the highest token a write
carried and refuses a lower one in the write's own transaction — the storage, not the
worker, rejects a stale writer."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from agentledger.testing.crm import Crm, Tenant

NOTE = {"body": "call back on Monday"}
REFUND = {"customer_id": "", "invoice_id": "inv-1", "amount_cents": 1500, "currency": "EUR",
          "reason": "damaged parcel"}


@pytest.fixture
async def tenant(crm: Crm) -> AsyncIterator[Tenant]:
    yield await crm.new_tenant()


def _key() -> str:
    return f"op-{uuid.uuid4()}"


def _fenced(token: int, key: str | None = None) -> dict[str, str]:
    return {"fencing-token": str(token), **({"fencing-key": key} if key else {})}


async def _refund(c: httpx.AsyncClient, t: Tenant, headers: dict[str, str]) -> httpx.Response:
    return await c.post("/v1/refunds", json={**REFUND, "customer_id": t.customer_id},
                        headers=headers)


def _is_stale(r: httpx.Response) -> bool:
    return r.status_code == 409 and r.json()["error"]["code"] == "stale_fencing_token"


async def test_a_lower_token_is_refused_and_applies_nothing(crm: Crm, tenant: Tenant) -> None:
    notes, key = f"/v1/customers/{tenant.customer_id}/notes", _key()
    async with crm.client(tenant.token) as c:
        newer = await c.post(notes, json={"body": "from generation 3"},
                             headers={"idempotency-key": key, **_fenced(3)})
        before = await crm.effects(tenant.tenant_id)
        stale = await c.post(notes, json=NOTE, headers={"idempotency-key": key, **_fenced(2)})
        # A stale contact update for the same key changes nothing either, If-Match or not.
        stale_update = await c.patch(f"/v1/customers/{tenant.customer_id}/contact",
                                     json={"email": "stale@example.com"},
                                     headers={"if-match": '"1"', **_fenced(1, key)})
        record = await c.get(f"/v1/customers/{tenant.customer_id}")

    assert newer.status_code == 201, newer.text
    assert _is_stale(stale), stale.text
    assert _is_stale(stale_update), stale_update.text
    assert "nothing was applied" in stale.json()["error"]["message"]
    assert await crm.effects(tenant.tenant_id) == before  # not a note, not a contact change
    assert [e["kind"] for e in before] == ["note.created"]
    assert (record.json()["email"], record.json()["revision"]) == ("ada@example.com", 1)


async def test_equal_and_higher_tokens_are_accepted_and_refunds_stay_non_idempotent(
    crm: Crm, tenant: Tenant
) -> None:
    key = _key()
    async with crm.client(tenant.token) as c:
        answers = [await _refund(c, tenant, _fenced(n, key)) for n in (1, 1, 2)]
        stale = await _refund(c, tenant, _fenced(1, key))
        # Another key has its own fence: generation 1 is the newest it has seen.
        other = await _refund(c, tenant, _fenced(1, _key()))

    assert [a.status_code for a in answers] == [201, 201, 201]
    assert _is_stale(stale), stale.text
    assert other.status_code == 201
    # The fencing key never dedupes a refund: every accepted call is a refund of its own.
    assert len({a.json()["refund_id"] for a in answers}) == 3
    assert [e["kind"] for e in await crm.effects(tenant.tenant_id)] == ["refund.created"] * 4


async def test_a_write_without_a_token_is_not_fenced(crm: Crm, tenant: Tenant) -> None:
    notes, key = f"/v1/customers/{tenant.customer_id}/notes", _key()
    async with crm.client(tenant.token) as c:
        fenced = await c.post(notes, json=NOTE, headers={"idempotency-key": key, **_fenced(5)})
        replayed = await c.post(notes, json=NOTE, headers={"idempotency-key": key})
        refund = await _refund(c, tenant, {"fencing-key": key})  # a key alone fences nothing

    assert fenced.status_code == 201
    # As before fencing existed: the key replays the original answer.
    assert replayed.status_code == 201 and replayed.headers["idempotent-replayed"] == "true"
    assert refund.status_code == 201
    assert len(await crm.effects(tenant.tenant_id)) == 2


async def test_fences_are_scoped_per_tenant(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    key = _key()
    async with crm.client(a.token) as c:
        assert (await _refund(c, a, _fenced(9, key))).status_code == 201
    async with crm.client(b.token) as c:
        assert (await _refund(c, b, _fenced(1, key))).status_code == 201


async def test_a_token_needs_a_key_and_a_number(crm: Crm, tenant: Tenant) -> None:
    async with crm.client(tenant.token) as c:
        keyless = await _refund(c, tenant, _fenced(1))
        malformed = await _refund(c, tenant, {"fencing-token": "-1", "fencing-key": _key()})

    assert keyless.status_code == 400 and keyless.json()["error"]["code"] == "invalid_header"
    assert malformed.status_code == 422, malformed.text
    assert await crm.effects(tenant.tenant_id) == []


async def test_concurrent_writers_of_one_key_never_apply_below_a_token_already_seen(
    crm: Crm, tenant: Tenant
) -> None:
    key, tokens = _key(), random.sample(range(1, 1000), 16)
    async with crm.client(tenant.token, timeout=30) as c:
        answers = await asyncio.gather(*(_refund(c, tenant, _fenced(n, key)) for n in tokens))
    accepted = [n for n, a in zip(tokens, answers, strict=True) if a.status_code == 201]
    refused = [n for n, a in zip(tokens, answers, strict=True) if _is_stale(a)]

    assert len(accepted) + len(refused) == len(tokens), [a.text for a in answers]
    assert max(tokens) in accepted  # nothing higher exists: the newest writer always lands
    assert all(n < max(accepted) for n in refused)
    # One effect per accepted write, none for a refused one.
    assert len(await crm.effects(tenant.tenant_id)) == len(accepted)
