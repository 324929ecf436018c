"""The one CRM read client: per-tenant read tokens, the ETag read once, one error mapping."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from agentledger import errors
from agentledger.resources import crm_client

TENANT, STRANGER = uuid.uuid4(), uuid.uuid4()


def reader(status: int, body: object = None, etag: str | None = None
           ) -> tuple[crm_client.CrmReader, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {"ETag": etag} if etag else {}
        return httpx.Response(status, content=json.dumps(body).encode(), headers=headers)

    client = httpx.AsyncClient(base_url="http://crm", transport=httpx.MockTransport(answer))
    return crm_client.CrmReader("http://crm", {str(TENANT): "read-t"}, client=client), seen


@pytest.mark.parametrize(("etag", "revision"), [('"7"', "7"), ('W/"7"', "7"), ("7", "7"),
                                                ("", None), (None, None)])
def test_the_etag_is_the_revision(etag: str | None, revision: str | None) -> None:
    assert crm_client.etag_revision(etag) == revision


async def test_a_customer_is_read_with_the_tenants_read_token() -> None:
    crm, seen = reader(200, {"customer_id": "c-1", "email": "a@example.com"}, 'W/"3"')
    found = await crm.customer(TENANT, "c-1")
    assert found is not None and found.revision == "3" and found.record["email"] == "a@example.com"
    assert [(r.url.path, r.headers["authorization"]) for r in seen] == [
        ("/v1/customers/c-1", "Bearer read-t")]


@pytest.mark.parametrize("status", [404, 422])
async def test_a_missing_customer_is_none(status: int) -> None:
    crm, _ = reader(status, {"error": "nope"})
    assert await crm.customer(TENANT, "c-404") is None


async def test_a_tenant_without_a_token_has_no_customers_and_nothing_is_sent() -> None:
    crm, seen = reader(200, {})
    assert not crm.reads_tenant(STRANGER)
    assert await crm.customer(STRANGER, "c-1") is None and seen == []


@pytest.mark.parametrize(("status", "error"), [(401, errors.IdentityRejected),
                                               (403, errors.IdentityRejected),
                                               (500, errors.StorageError),
                                               (302, errors.StorageError)])
async def test_other_answers_are_typed_errors(status: int, error: type[Exception]) -> None:
    crm, _ = reader(status, {})
    with pytest.raises(error):
        await crm.customer(TENANT, "c-1")


async def test_an_unreachable_crm_is_a_storage_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = httpx.AsyncClient(base_url="http://crm", transport=httpx.MockTransport(refuse))
    crm = crm_client.CrmReader("http://crm", {str(TENANT): "t"}, client=client)
    with pytest.raises(errors.StorageError):
        await crm.customer(TENANT, "c-1")
