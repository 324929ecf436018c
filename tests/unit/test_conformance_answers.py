"""The conformance kit's `answers` claim fires on a connector that trusts what comes back
(issue 38): it is checked against hostile stand-ins, and a naive connector fails it."""

from __future__ import annotations

import uuid

import aiohttp
import pytest

from agentledger.connectors import base, conformance, crm, hostile


class Naive:
    """Follows redirects and calls any answer below 400 applied: what issue 38 found."""

    name = "naive"
    actions = frozenset({"crm.note.create"})
    contract = base.Contract("keyed", call_timeout_s=5.0)
    scopes: frozenset[base.Scope] = frozenset({"write"})

    def __init__(self, url: str) -> None:
        self.url = url

    async def execute(self, call: base.Call, token: str) -> base.Result:
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.url}/v1/notes", json=dict(call.arguments)) as answer:
            text = await answer.text()
        return base.Applied(text) if answer.status < 400 else base.Refused("no", answer.status)

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return base.NotFound()

    async def aclose(self) -> None:
        return None


def _endpoint(make: object) -> conformance.Endpoint:
    return conformance.Endpoint(
        connector=make("http://127.0.0.1:9"), tenant_id=uuid.uuid4(),  # type: ignore[operator]
        write_token="t", lookup_token="t",
        sample=conformance.Sample("crm.note.create", "c-1", {"customer_id": "c-1", "body": "x"}),
        retarget=lambda t: make(t.http_url))  # type: ignore[operator]


async def test_a_connector_that_follows_redirects_and_trusts_bodies_fails_the_claim() -> None:
    found = await conformance._answers(_endpoint(Naive))
    assert found.holds is False
    assert found.detail.startswith("a 302 after the write"), found.detail


async def test_the_crm_connector_keeps_the_claim() -> None:
    found = await conformance._answers(_endpoint(crm.CrmConnector))
    assert found.holds is True, found.detail
    assert found.detail.startswith(f"{len(conformance.BATTERY)} hostile answers"), found.detail


@pytest.mark.parametrize(("result", "applied", "wrong"), [
    (base.Applied("r"), False, "invented success"),
    (base.Applied("r\x00"), True, "cannot store"),
    (base.NotSent("x"), True, "would be lost"),
    (base.Refused("x", 400), True, "would be lost"),
    (base.InDoubt("x"), True, None),
    (base.InDoubt("x"), False, None),
    (base.Applied("r"), True, None),
])
def test_the_judge(result: base.Result, applied: bool, wrong: str | None) -> None:
    found = conformance.judge(result, applied=applied)
    assert (found is None) if wrong is None else (wrong in str(found))


async def test_the_stand_in_lies_about_a_length_and_records_what_it_applied() -> None:
    async with hostile.http(lambda r: hostile.HttpAnswer(
            201, b'{"a"', content_length=100, applies=r.method == "POST")) as provider:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with http.post(provider.url + "/x", data=b"hi") as answer:
                    await answer.read()
    assert [r.body for r in provider.applied] == [b"hi"]
