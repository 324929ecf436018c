"""Idempotency keys on notes and contact updates: one effect per key, original answer replayed."""

from __future__ import annotations

import asyncio
import uuid

from agentledger.testing.crm import Crm

NOTE = {"body": "call back on Monday"}


def _key() -> str:
    return f"op-{uuid.uuid4()}"


async def test_replay_returns_the_original_response_byte_for_byte_and_one_effect(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    async with crm.client(t.token) as c:
        first = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key})
        # Same request with another key order and spacing: the same canonical body.
        second = await c.post(f"/v1/customers/{t.customer_id}/notes",
                              content=b'{ "body" :  "call back on Monday" }',
                              headers={"idempotency-key": key, "content-type": "application/json"})

    assert first.status_code == second.status_code == 201
    assert second.content == first.content
    assert second.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    effects = await crm.effects(t.tenant_id)
    assert [(e["kind"], e["idempotency_key"]) for e in effects] == [("note.created", key)]


async def test_same_key_with_a_different_body_is_422_and_changes_nothing(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    async with crm.client(t.token) as c:
        first = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key})
        other = await c.post(f"/v1/customers/{t.customer_id}/notes", json={"body": "tampered"},
                             headers={"idempotency-key": key})
        again = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key})

    assert first.status_code == 201
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert again.content == first.content  # the original binding survives the conflict
    assert len(await crm.effects(t.tenant_id)) == 1


async def test_twenty_concurrent_requests_with_one_key_make_one_effect(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    async with crm.client(t.token, timeout=30) as c:
        responses = await asyncio.gather(*(
            c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                   headers={"idempotency-key": key})
            for _ in range(20)
        ))

    assert {r.status_code for r in responses} == {201}
    assert len({r.content for r in responses}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    assert len(await crm.effects(t.tenant_id)) == 1


async def test_keys_are_scoped_per_tenant(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    key = _key()
    for t in (a, b):
        async with crm.client(t.token) as c:
            r = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key})
        assert r.status_code == 201
        assert "idempotent-replayed" not in r.headers
    assert len(await crm.effects(a.tenant_id)) == len(await crm.effects(b.tenant_id)) == 1


async def test_note_with_a_stale_if_match_is_412_and_writes_nothing(crm: Crm) -> None:
    t = await crm.new_tenant()
    async with crm.client(t.token) as c:
        stale = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"if-match": '"7"', "idempotency-key": _key()})
        current = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                               headers={"if-match": '"1"'})

    assert stale.status_code == 412
    assert stale.json()["error"]["code"] == "precondition_failed"
    assert current.status_code == 201
    assert len(await crm.effects(t.tenant_id)) == 1


async def test_a_refused_note_leaves_its_key_unclaimed(crm: Crm) -> None:
    # A note is one statement (issue 20 §4): its key is claimed only together with the note,
    # so a note refused (missing customer, stale If-Match) leaves the key free for the
    # request that can apply — no key bound to a response that was never given.
    t = await crm.new_tenant()
    key, missing = _key(), f"c-{uuid.uuid4().hex[:8]}"
    async with crm.client(t.token) as c:
        absent = await c.post(f"/v1/customers/{missing}/notes", json=NOTE,
                              headers={"idempotency-key": key})
        stale = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key, "if-match": '"7"'})
        lookup = await c.get(f"/v1/operations/{key}")
        applied = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                               headers={"idempotency-key": key, "if-match": '"1"'})
        replayed = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                                headers={"idempotency-key": key, "if-match": '"1"'})

    assert (absent.status_code, stale.status_code, lookup.status_code) == (404, 412, 404)
    assert applied.status_code == 201 and "idempotent-replayed" not in applied.headers
    assert replayed.content == applied.content
    assert replayed.headers["idempotent-replayed"] == "true"
    assert [(e["kind"], e["idempotency_key"]) for e in await crm.effects(t.tenant_id)] == [
        ("note.created", key)]


async def test_contact_update_requires_if_match(crm: Crm) -> None:
    t = await crm.new_tenant()
    async with crm.client(t.token) as c:
        missing = await c.patch(f"/v1/customers/{t.customer_id}/contact",
                                json={"phone": "+33 1 23 45 67 89"})
        stale = await c.patch(f"/v1/customers/{t.customer_id}/contact",
                              json={"phone": "+33 1 23 45 67 89"}, headers={"if-match": '"2"'})
        weak = await c.patch(f"/v1/customers/{t.customer_id}/contact",
                             json={"phone": "+33 1 23 45 67 89"}, headers={"if-match": 'W/"1"'})
        record = await c.get(f"/v1/customers/{t.customer_id}")

    assert missing.status_code == 428
    assert missing.json()["error"]["code"] == "precondition_required"
    assert stale.status_code == 412
    assert weak.status_code == 412  # If-Match compares strongly
    assert record.headers["etag"] == '"1"'
    assert record.json()["phone"] is None
    assert await crm.effects(t.tenant_id) == []


async def test_contact_update_bumps_the_revision_and_notes_do_not(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    path = f"/v1/customers/{t.customer_id}"
    async with crm.client(t.token) as c:
        before = await c.get(path)
        updated = await c.patch(f"{path}/contact", json={"city": "Lyon", "email": None},
                                headers={"if-match": before.headers["etag"],
                                         "idempotency-key": key})
        replayed = await c.patch(f"{path}/contact", json={"city": "Lyon", "email": None},
                                 headers={"if-match": before.headers["etag"],
                                          "idempotency-key": key})
        note = await c.post(f"{path}/notes", json=NOTE, headers={"if-match": '"2"'})
        after = await c.get(path)

    assert before.headers["etag"] == '"1"'
    assert updated.status_code == 200
    assert updated.headers["etag"] == '"2"'
    assert updated.json()["revision"] == 2
    assert updated.json()["city"] == "Lyon"
    assert updated.json()["email"] is None
    assert replayed.content == updated.content
    assert replayed.headers["etag"] == '"2"'
    assert replayed.headers["idempotent-replayed"] == "true"
    assert note.status_code == 201
    assert after.headers["etag"] == '"2"'
    kinds = [e["kind"] for e in await crm.effects(t.tenant_id)]
    assert kinds == ["contact.updated", "note.created"]


async def test_lookup_by_key_returns_the_recorded_response(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    async with crm.client(t.token) as c:
        created = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE,
                               headers={"idempotency-key": key})
        found = await c.get(f"/v1/operations/{key}")
        unknown = await c.get(f"/v1/operations/{_key()}")

    assert found.status_code == 200
    operation = found.json()
    assert operation["idempotency_key"] == key
    assert operation["status"] == 201
    assert operation["method"] == "POST"
    assert operation["path"] == f"/v1/customers/{t.customer_id}/notes"
    assert operation["response"] == created.json()
    assert unknown.status_code == 404


async def test_refunds_are_not_idempotent_one_effect_per_call(crm: Crm) -> None:
    t = await crm.new_tenant()
    key = _key()
    refund = {"customer_id": t.customer_id, "invoice_id": "inv-1", "amount_cents": 1250, "currency": "EUR",
              "reason": "damaged parcel"}
    async with crm.client(t.token) as c:
        responses = [await c.post("/v1/refunds", json=refund, headers={"idempotency-key": key})
                     for _ in range(3)]
        lookup = await c.get(f"/v1/operations/{key}")

    assert [r.status_code for r in responses] == [201, 201, 201]
    assert len({r.json()["refund_id"] for r in responses}) == 3
    assert all("idempotent-replayed" not in r.headers for r in responses)
    assert lookup.status_code == 404
    effects = await crm.effects(t.tenant_id)
    assert [(e["kind"], e["idempotency_key"]) for e in effects] == [("refund.created", None)] * 3
