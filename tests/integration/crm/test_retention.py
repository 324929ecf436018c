"""A short key-retention window, in a process with fault injection disabled."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from agentledger.testing.crm import Crm
from tests.helpers import assert_eventually

NOTE = {"body": "call back on Monday"}
# Short enough to watch a key expire in a test; polled with a deadline, never slept on; long
# enough that the lookup right after the write lands inside the window on a loaded box.
RETENTION_SECONDS = 5.0


@pytest.fixture(scope="module")
def short_crm(crm_factory: Callable[..., Crm]) -> Crm:
    return crm_factory(idempotency_retention_seconds=str(RETENTION_SECONDS))


async def test_keys_are_forgotten_after_the_retention_window(short_crm: Crm) -> None:
    t = await short_crm.new_tenant()
    key = f"op-{uuid.uuid4()}"
    notes = f"/v1/customers/{t.customer_id}/notes"
    async with short_crm.client(t.token) as c:
        assert (await c.post(notes, json=NOTE, headers={"idempotency-key": key})).status_code == 201
        assert (await c.get(f"/v1/operations/{key}")).status_code == 200

        async def forgotten() -> bool:
            return (await c.get(f"/v1/operations/{key}")).status_code == 404

        await assert_eventually(forgotten, timeout=RETENTION_SECONDS + 10,
                                message="key still known after its retention window")
        # Forgotten means reusable: the key now binds a new request and a new effect.
        reused = await c.post(notes, json={"body": "another"}, headers={"idempotency-key": key})

    assert reused.status_code == 201
    assert "idempotent-replayed" not in reused.headers
    assert len(await short_crm.effects(t.tenant_id)) == 2


async def test_fault_admin_does_not_exist_when_faults_are_disabled(short_crm: Crm) -> None:
    async with short_crm.admin() as admin:
        responses = [await admin.post("/admin/faults", json={
                         "match": {"path_prefix": "/"}, "action": "fail_before_commit"}),
                     await admin.get("/admin/faults"),
                     await admin.delete("/admin/faults")]
    assert [r.status_code for r in responses] == [404, 404, 404]
