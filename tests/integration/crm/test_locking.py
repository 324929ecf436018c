"""What a write locks (issue 20 §4): notes on one customer do not wait for each other; a
contact update, which moves the revision, waits for every write that checked it."""

from __future__ import annotations

import asyncio

import asyncpg

from agentledger.testing.crm import Crm
from tests.helpers import assert_eventually

NOTE = {"body": "call back on Monday"}


async def test_a_note_goes_on_beside_an_open_write_while_a_contact_update_waits_for_it(crm: Crm) -> None:
    t = await crm.new_tenant()
    held = await asyncpg.connect(crm.database_url)
    try:
        # A note's transaction still open on this customer (what the CRM holds while a note
        # is being written): the share lock every note takes.
        tx = held.transaction()
        await tx.start()
        await held.execute("SELECT 1 FROM crm_customer WHERE tenant_id = $1 AND customer_id = $2 FOR SHARE",
                           t.tenant_id, t.customer_id)
        async with crm.client(t.token, timeout=10) as c:
            note = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                                headers={"if-match": '"1"'})
            assert note.status_code == 201  # did not wait for the open write
            update = asyncio.create_task(c.patch(f"/v1/customers/{t.customer_id}/contact",
                                                 json={"city": "Turin"}, headers={"if-match": '"1"'}))

            async def update_waits() -> bool:
                assert not update.done(), (update.result().status_code, update.result().text)
                return bool(await held.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"))
            await assert_eventually(update_waits, timeout=10, message="the contact update never waited")
            assert not update.done()
            await tx.commit()
            answer = await update
        assert answer.status_code == 200 and answer.json()["revision"] == 2
    finally:
        await held.close()
