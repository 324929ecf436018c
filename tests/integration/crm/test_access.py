"""Tenant isolation, token scopes, the admin token, validation, health."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import uuid

import asyncpg

from agentledger.testing.crm import Crm

JSON = "application/json"
NOTE = {"body": "call back on Monday"}


async def test_health_and_readiness(crm: Crm) -> None:
    async with crm.client() as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).json() == {"status": "ready"}


async def test_another_tenants_customer_is_indistinguishable_from_a_missing_one(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    async with crm.client(a.token) as c:
        foreign = await c.get(f"/v1/customers/{b.customer_id}")
        missing = await c.get(f"/v1/customers/c-{uuid.uuid4().hex[:8]}")
        note = await c.post(f"/v1/customers/{b.customer_id}/notes", json=NOTE,
                            headers={"idempotency-key": "k-foreign"})
        contact = await c.patch(f"/v1/customers/{b.customer_id}/contact",
                                json={"city": "Turin"}, headers={"if-match": '"1"'})
        refund = await c.post("/v1/refunds", json={
            "customer_id": b.customer_id, "invoice_id": "inv-1", "amount_cents": 1, "currency": "EUR", "reason": "x"})

    assert foreign.status_code == missing.status_code == 404
    assert foreign.content == missing.content
    assert [r.status_code for r in (note, contact, refund)] == [404, 404, 404]
    assert await crm.effects(a.tenant_id) == []
    assert await crm.effects(b.tenant_id) == []


async def test_lookup_and_effects_do_not_cross_tenants(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    key = f"op-{uuid.uuid4()}"
    async with crm.client(b.token) as c:
        assert (await c.post(f"/v1/customers/{b.customer_id}/notes", json=NOTE,
                             headers={"idempotency-key": key})).status_code == 201
    async with crm.client(a.token) as c:
        across = await c.get(f"/v1/operations/{key}")

    assert across.status_code == 404
    assert await crm.effects(a.tenant_id) == []
    assert {e["tenant_id"] for e in await crm.effects(b.tenant_id)} == {b.tenant_id}


async def test_each_operation_needs_its_scope(crm: Crm) -> None:
    t = await crm.new_tenant()
    read_only = await crm.token(t.tenant_id, "read")
    write_only = await crm.token(t.tenant_id, "write")
    async with crm.client(read_only) as c:
        assert (await c.get(f"/v1/customers/{t.customer_id}")).status_code == 200
        denied = await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE)
        assert (await c.get("/v1/operations/anything")).status_code == 403
    async with crm.client(write_only) as c:
        assert (await c.get(f"/v1/customers/{t.customer_id}")).status_code == 403
        assert (await c.post(f"/v1/customers/{t.customer_id}/notes", json=NOTE)).status_code == 201

    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "insufficient_scope"
    assert len(await crm.effects(t.tenant_id)) == 1


async def test_missing_or_unknown_token_is_401(crm: Crm) -> None:
    t = await crm.new_tenant()
    for token in (None, "crm_not-a-token"):
        async with crm.client(token) as c:
            r = await c.get(f"/v1/customers/{t.customer_id}")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "unauthenticated"


async def test_admin_surface_needs_the_admin_token(crm: Crm) -> None:
    t = await crm.new_tenant()
    for token in (None, t.token):
        async with crm.client(token) as c:
            assert (await c.get("/admin/effects", params={"tenant": t.tenant_id})).status_code == 401
            assert (await c.post(f"/admin/tenants/{t.tenant_id}/tokens",
                                 json={"scopes": ["write"]})).status_code == 401


async def test_invalid_requests_get_clear_4xx_errors(crm: Crm) -> None:
    t = await crm.new_tenant()
    notes = f"/v1/customers/{t.customer_id}/notes"
    async with crm.client(t.token) as c:
        extra = await c.post(notes, json={**NOTE, "author": "model"})
        too_long = await c.post(notes, json={"body": "x" * 4001})
        bad_key = await c.post(notes, json=NOTE, headers={"idempotency-key": "has space"})
        star = await c.post(notes, json=NOTE, headers={"if-match": "*"})
        # The hot routes parse by hand (issue 20 §4): the same answers as declared parameters.
        not_json = await c.post(notes, content=b'{"body": ', headers={"content-type": JSON})
        bad_fence = await c.post(notes, json=NOTE, headers={"fencing-token": "-1",
                                                            "fencing-key": "k"})
        long_match = await c.post(notes, json=NOTE, headers={"if-match": '"1",' * 200})
        bad_id = await c.post("/v1/customers/has%20space/notes", json=NOTE)
        bad_read = await c.get("/v1/customers/has%20space")
        empty_patch = await c.patch(f"/v1/customers/{t.customer_id}/contact", json={},
                                    headers={"if-match": '"1"'})
        string_amount = await c.post("/v1/refunds", json={
            "customer_id": t.customer_id, "invoice_id": "inv-1", "amount_cents": "10", "currency": "EUR",
            "reason": "x"})

    for r in (extra, too_long, bad_key, empty_patch, string_amount, not_json, bad_fence,
              long_match, bad_id, bad_read):
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert "x" * 100 not in r.text  # the input is not echoed
    assert star.status_code == 400
    assert star.json()["error"]["code"] == "invalid_header"
    assert await crm.effects(t.tenant_id) == []


async def test_tokens_are_stored_hashed_and_never_logged(crm: Crm) -> None:
    t = await crm.new_tenant()
    async with crm.client(t.token) as c:
        assert (await c.get(f"/v1/customers/{t.customer_id}")).status_code == 200
    conn = await asyncpg.connect(crm.database_url)
    try:
        stored = await conn.fetch(
            "SELECT token_sha256 FROM crm_api_token WHERE tenant_id = $1", t.tenant_id
        )
    finally:
        await conn.close()

    assert [bytes(r["token_sha256"]) for r in stored] == [hashlib.sha256(t.token.encode()).digest()]
    assert t.token not in crm.log_path.read_text()


async def test_unknown_route_is_a_json_404(crm: Crm) -> None:
    async with crm.client() as c:
        r = await c.get("/v1/nowhere")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


async def test_cli_seed_creates_a_customer_and_a_working_token(crm: Crm) -> None:
    tenant, customer = f"t-{uuid.uuid4().hex[:12]}", f"c-{uuid.uuid4().hex[:8]}"
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentledger.services.crm", "seed", "--tenant", tenant,
        "--customer", customer, "--name", "Ada Lovelace", "--scopes", "read",
        env={**os.environ, "AGENTLEDGER_CRM_DATABASE_URL": crm.database_url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(cli.communicate(), timeout=60)
    assert cli.returncode == 0, stderr.decode()
    seeded = json.loads(stdout)
    async with crm.client(seeded["token"]) as c:
        record = await c.get(f"/v1/customers/{customer}")
        write = await c.post(f"/v1/customers/{customer}/notes", json=NOTE)

    assert record.status_code == 200
    assert record.json()["display_name"] == "Ada Lovelace"
    assert write.status_code == 403
    assert seeded["token"] not in stderr.decode()


async def test_text_the_database_cannot_store_is_refused_with_a_422_not_an_outage(crm: Crm) -> None:
    # Issue 17: a NUL in a note body made the CRM's database refuse the write and the CRM
    # answer 503, which a client (the executor) reads as "in doubt" and retries without end.
    t = await crm.new_tenant()
    async with crm.client(t.token) as c:
        refused = await c.post(f"/v1/customers/{t.customer_id}/notes", json={"body": "a\u0000b"},
                               headers={"idempotency-key": f"op-{uuid.uuid4()}"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "unstorable_input"
    assert await crm.effects(t.tenant_id) == []


async def test_a_remembered_token_keeps_exactly_its_tenant_and_scopes(crm: Crm) -> None:
    # Issue 20 §4: found tokens are kept in memory; the second sighting of each must answer
    # exactly as the first (scopes and tenant), and tokens must never stand in for each other.
    a, b = await crm.new_tenant(), await crm.new_tenant()
    read_a, write_a = await crm.token(a.tenant_id, "read"), await crm.token(a.tenant_id, "write")
    for _ in range(2):
        async with crm.client(read_a) as c:
            assert (await c.get(f"/v1/customers/{a.customer_id}")).status_code == 200
            assert (await c.get(f"/v1/customers/{b.customer_id}")).status_code == 404
            assert (await c.post(f"/v1/customers/{a.customer_id}/notes", json=NOTE)).status_code == 403
        async with crm.client(write_a) as c:
            assert (await c.get(f"/v1/customers/{a.customer_id}")).status_code == 403
        async with crm.client(b.token) as c:
            assert (await c.get(f"/v1/customers/{b.customer_id}")).status_code == 200
            assert (await c.get(f"/v1/customers/{a.customer_id}")).status_code == 404
    assert await crm.effects(a.tenant_id) == []
