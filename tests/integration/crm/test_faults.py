"""Fault injection: what the client sees, and what the CRM actually committed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentledger.testing.crm import Crm, Tenant
from tests.helpers import assert_eventually

NOTE = {"body": "call back on Monday"}
# Long enough for the note transaction to commit; far past the client timeout below.
LATE_MS = 3_000
CLIENT_TIMEOUT = 0.5


@pytest.fixture
async def tenant(crm: Crm) -> AsyncIterator[Tenant]:
    yield await crm.new_tenant()
    await crm.disarm()  # a test's leftover rule must not fire in the next one


def _rule(action: str, path_prefix: str, **extra: Any) -> dict[str, Any]:
    return {"match": {"method": "POST", "path_prefix": path_prefix}, "action": action, **extra}


async def _effects_exactly(crm: Crm, tenant_id: str, n: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]]:
        effects = await crm.effects(tenant_id)
        assert len(effects) == n, effects
        return effects or [{}]

    return await assert_eventually(probe, timeout=10)


async def test_fail_before_commit_is_503_and_writes_nothing(crm: Crm, tenant: Tenant) -> None:
    notes = f"/v1/customers/{tenant.customer_id}/notes"
    key = f"op-{uuid.uuid4()}"
    await crm.arm(_rule("fail_before_commit", notes))
    async with crm.client(tenant.token) as c:
        failed = await c.post(notes, json=NOTE, headers={"idempotency-key": key})
        lookup = await c.get(f"/v1/operations/{key}")
        retried = await c.post(notes, json=NOTE, headers={"idempotency-key": key})

    assert failed.status_code == 503
    assert failed.json()["error"]["code"] == "fault_injected"
    assert lookup.status_code == 404  # the key claim was rolled back with the note
    assert retried.status_code == 201
    assert "idempotent-replayed" not in retried.headers
    assert len(await crm.effects(tenant.tenant_id)) == 1


async def test_drop_after_commit_is_a_transport_error_with_one_effect(
    crm: Crm, tenant: Tenant
) -> None:
    notes = f"/v1/customers/{tenant.customer_id}/notes"
    key = f"op-{uuid.uuid4()}"
    await crm.arm(_rule("drop_after_commit", notes))
    async with crm.client(tenant.token) as c:
        with pytest.raises(httpx.TransportError):
            await c.post(notes, json=NOTE, headers={"idempotency-key": key})
        effects = await _effects_exactly(crm, tenant.tenant_id, 1)
        lookup = await c.get(f"/v1/operations/{key}")
        retried = await c.post(notes, json=NOTE, headers={"idempotency-key": key})

    assert effects[0]["idempotency_key"] == key
    assert lookup.status_code == 200
    assert retried.status_code == 201
    assert retried.headers["idempotent-replayed"] == "true"
    assert retried.json() == lookup.json()["response"]
    assert len(await crm.effects(tenant.tenant_id)) == 1


async def test_dropped_refund_was_still_made(crm: Crm, tenant: Tenant) -> None:
    await crm.arm(_rule("drop_after_commit", "/v1/refunds"))
    refund = {"customer_id": tenant.customer_id, "invoice_id": "inv-1", "amount_cents": 500, "currency": "EUR",
              "reason": "late delivery"}
    async with crm.client(tenant.token) as c:
        with pytest.raises(httpx.TransportError):
            await c.post("/v1/refunds", json=refund)

    effects = await _effects_exactly(crm, tenant.tenant_id, 1)
    assert effects[0]["kind"] == "refund.created"


async def test_late_answer_after_commit_times_out_the_client_with_one_effect(
    crm: Crm, tenant: Tenant
) -> None:
    notes = f"/v1/customers/{tenant.customer_id}/notes"
    key = f"op-{uuid.uuid4()}"
    await crm.arm(_rule("late_answer_after_commit", notes, delay_ms=LATE_MS))
    async with crm.client(tenant.token, timeout=CLIENT_TIMEOUT) as c:
        with pytest.raises(httpx.TimeoutException):
            await c.post(notes, json=NOTE, headers={"idempotency-key": key})
    effects = await _effects_exactly(crm, tenant.tenant_id, 1)
    async with crm.client(tenant.token) as c:  # the short timeout was for the late answer only
        lookup = await c.get(f"/v1/operations/{key}")

    assert effects[0]["idempotency_key"] == key
    assert lookup.status_code == 200


async def test_delay_then_handles_normally(crm: Crm, tenant: Tenant) -> None:
    notes = f"/v1/customers/{tenant.customer_id}/notes"
    await crm.arm(_rule("delay", notes, delay_ms=400))
    async with crm.client(tenant.token, timeout=10) as c:
        started = time.monotonic()
        delayed = await c.post(notes, json=NOTE)
        elapsed = time.monotonic() - started
        async with crm.admin() as admin:
            left = (await admin.get("/admin/faults")).json()["rules"]
        normal = await c.post(notes, json=NOTE)

    assert delayed.status_code == normal.status_code == 201
    assert elapsed >= 0.4  # a lower bound only: a loaded box makes it slower, never faster
    assert left == []  # times=1: the rule fired once and is gone (no upper bound on a timing)
    assert len(await crm.effects(tenant.tenant_id)) == 2


async def test_rules_match_method_and_prefix_and_clear(crm: Crm, tenant: Tenant) -> None:
    notes = f"/v1/customers/{tenant.customer_id}/notes"
    await crm.arm(_rule("fail_before_commit", notes, times=None))
    async with crm.client(tenant.token) as c:
        read = await c.get(f"/v1/customers/{tenant.customer_id}")  # a GET does not match
        first = await c.post(notes, json=NOTE)
        second = await c.post(notes, json=NOTE)
        await crm.disarm()
        cleared = await c.post(notes, json=NOTE)

    assert read.status_code == 200
    assert first.status_code == second.status_code == 503
    assert cleared.status_code == 201
    assert len(await crm.effects(tenant.tenant_id)) == 1


async def test_bad_fault_rules_are_refused(crm: Crm) -> None:
    async with crm.admin() as admin:
        r = await admin.post("/admin/faults", json=_rule("explode", "/v1"))
    assert r.status_code == 422
