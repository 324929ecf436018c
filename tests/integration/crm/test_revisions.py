"""One read for many targets (issue 20 §2): ``GET /v1/customers?id=…`` on the CRM stand-in,
and admission's resolver that sends the resolutions asked together as one such read — every
answer still read after it was asked (R1.4: no cache can hide a revision change)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentledger import errors
from agentledger.resources.crm import CrmResolver
from agentledger.testing import processes
from agentledger.testing.crm import Crm


async def test_revisions_of_many_ids_in_one_read_only_the_tenants_own(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    second = await crm.customer(a.tenant_id, "c-second")
    second = await crm.customer(a.tenant_id, "c-second")  # revision 2
    async with crm.client(a.token) as c:
        r = await c.get("/v1/customers", params=[
            ("id", a.customer_id), ("id", "c-second"), ("id", "c-missing"), ("id", b.customer_id)])
    assert r.status_code == 200, r.text
    assert r.json() == {"revisions": {a.customer_id: 1, "c-second": second["revision"]}}
    assert second["revision"] == 2


@pytest.mark.parametrize("params", [
    [],                                          # no id
    [("id", "bad id!")],                          # outside the id alphabet
    [("id", f"c-{i}") for i in range(101)],       # more than one read may hold
])
async def test_a_read_of_many_refuses_a_malformed_list(crm: Crm, params: list[tuple[str, str]]) -> None:
    a = await crm.new_tenant()
    async with crm.client(a.token) as c:
        r = await c.get("/v1/customers", params=params)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


async def test_a_read_of_many_needs_the_read_scope(crm: Crm) -> None:
    a = await crm.new_tenant()
    write_only = await crm.token(a.tenant_id, "write")
    async with crm.client(write_only) as c:
        assert (await c.get("/v1/customers", params={"id": a.customer_id})).status_code == 403
    async with crm.client() as c:
        assert (await c.get("/v1/customers", params={"id": a.customer_id})).status_code == 401


async def test_resolutions_asked_together_share_one_read(crm: Crm) -> None:
    a, b = await crm.new_tenant(), await crm.new_tenant()
    await crm.customer(a.tenant_id, "c-two")
    tenant = uuid.uuid4()
    resolver = CrmResolver(crm.url, {str(tenant): await crm.token(a.tenant_id, "read")})
    try:
        asked = [a.customer_id, "c-two", a.customer_id, "c-missing", b.customer_id, "bad id!"]
        got = await asyncio.gather(*(resolver.resolve(tenant, "crm", i) for i in asked),
                                   return_exceptions=True)
    finally:
        await resolver.aclose()
    assert [getattr(g, "revision", None) for g in got[:3]] == ["1", "1", "1"]
    assert all(isinstance(g, errors.ResourceNotFound) for g in got[3:])
    # One read for the five ids; the id the CRM cannot hold made it ask each alone after.
    assert resolver.reads == 1 + 5


async def test_every_resolution_reads_the_current_revision(crm: Crm) -> None:
    a = await crm.new_tenant()
    tenant = uuid.uuid4()
    resolver = CrmResolver(crm.url, {str(tenant): await crm.token(a.tenant_id, "read")})
    try:
        before = await resolver.resolve(tenant, "crm", a.customer_id)
        await crm.customer(a.tenant_id, a.customer_id, city="Turin")  # bumps the revision
        after = await resolver.resolve(tenant, "crm", a.customer_id)
    finally:
        await resolver.aclose()
    assert (before.revision, after.revision, resolver.reads) == ("1", "2", 2)


async def test_a_crm_that_cannot_be_reached_fails_every_resolution_retryably() -> None:
    tenant = uuid.uuid4()
    resolver = CrmResolver(f"http://127.0.0.1:{processes.free_port()}", {str(tenant): "t"})
    try:
        got = await asyncio.gather(*(resolver.resolve(tenant, "crm", f"c-{i}") for i in range(3)),
                                   return_exceptions=True)
    finally:
        await resolver.aclose()
    assert all(isinstance(g, errors.StorageError) and g.retryable for g in got), got
    assert resolver.reads == 1
