"""The conformance kit against real endpoints: the CRM stand-in through its built-in
connector and through the declarative HTTP connector (configuration only), and a
deliberately broken endpoint whose broken claims the kit must name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import agentledger_http
import pytest
from aiohttp import web
from typer.testing import CliRunner

from agentledger import cli
from agentledger.connectors import conformance, plugins
from agentledger.testing.crm import Crm
from tests.helpers import serving


def declared(url: str) -> dict[str, Any]:
    """The CRM's note API declared for agentledger-http (its shipped example), with the
    action named as the kit's sample calls it."""
    found = agentledger_http.example("crm_notes", crm_url=url)
    found["actions"] = {"crm.note.create": found["actions"]["crmhttp.note.create"]}
    return found


def endpoint(connector: Any, token: str, customer: str,
             options: tuple[str, dict[str, Any]] | None = None) -> conformance.Endpoint:
    """The kit's endpoint; ``options``: (name, options) the connector was made from, so the
    kit can point a copy of it at hostile stand-ins (the ``answers`` claim)."""
    retarget = None
    if options is not None:
        name, made_from = options
        retarget = lambda t: plugins.make(name, plugins.retargeted(  # noqa: E731
            made_from, http_url=t.http_url, smtp_host=t.smtp_host, smtp_port=t.smtp_port))
    return conformance.Endpoint(
        connector=connector, tenant_id=uuid.uuid4(), write_token=token, lookup_token=token,
        sample=conformance.Sample("crm.note.create", customer,
                                  {"customer_id": customer, "body": "conformance"}),
        stale_revision="999", retarget=retarget)


def outcome(findings: list[conformance.Finding]) -> dict[str, bool | None]:
    return {f.claim: f.holds for f in findings}


ALL_HOLD = {"applies": True, "dedupes": True, "lookup_finds": True, "lookup_not_found": True,
            "if_match": True, "fencing": True, "lookup_ignores_lookalike": True, "answers": True}


async def test_the_crm_keeps_its_declared_contract(crm: Crm) -> None:
    tenant = await crm.new_tenant()
    connector = plugins.make("crm", {"url": crm.url})
    try:
        found = await conformance.check(endpoint(connector, tenant.token, tenant.customer_id,
                                                 ("crm", {"url": crm.url})))
    finally:
        await connector.aclose()
    assert outcome(found) == ALL_HOLD, found
    notes = [e for e in await crm.effects(tenant.tenant_id) if e["kind"] == "note.created"]
    # The sample (sent twice, one effect); the fenced call applied nothing, and no hostile
    # answer reached the CRM.
    assert len(notes) == 1


async def test_the_declarative_http_connector_keeps_the_crms_contract(
    crm: Crm, connector_conformance: Any,
) -> None:
    tenant = await crm.new_tenant()
    connector = plugins.make("crmhttp", declared(crm.url))
    assert connector.contract.idempotency == "keyed" and connector.contract.fencing
    try:
        found = await connector_conformance(endpoint(connector, tenant.token,
                                                     tenant.customer_id,
                                                     ("crmhttp", declared(crm.url))))
    finally:
        await connector.aclose()
    assert outcome(found) == ALL_HOLD, found
    resolver = plugins.resolver({"crmhttp": declared(crm.url)},
                                {"crmhttp": {str(uuid.UUID(int=1)): tenant.token}})
    try:
        resolved = await resolver.resolve(uuid.UUID(int=1), "crmhttp", tenant.customer_id)
        assert resolved.revision is not None and int(resolved.revision) >= 1
    finally:
        await resolver.aclose()


@pytest.fixture
async def broken() -> AsyncIterator[str]:
    """A notes API that claims what the CRM does but ignores the key, If-Match and fencing,
    and whose lookup never finds anything."""
    async def note(request: web.Request) -> web.Response:
        return web.json_response({"note_id": uuid.uuid4().hex}, status=201)

    async def operation(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "not_found"}}, status=404)

    app = web.Application()
    app.router.add_post("/v1/customers/{customer}/notes", note)
    app.router.add_get("/v1/operations/{key}", operation)
    async with serving(app) as url:
        yield url


async def test_the_kit_names_every_claim_a_broken_endpoint_does_not_keep(broken: str) -> None:
    connector = plugins.make("crmhttp", declared(broken))
    try:
        found = await conformance.check(endpoint(connector, "t", "c-1"))
    finally:
        await connector.aclose()
    assert outcome(found) == {"applies": True, "dedupes": False, "lookup_finds": False,
                              "lookup_not_found": True, "if_match": False, "fencing": False,
                              "lookup_ignores_lookalike": True, "answers": None}
    details = {f.claim: f.detail for f in conformance.failed(found)}
    assert "does not deduplicate" in details["dedupes"]
    assert "could not fence a stalled worker out" in details["fencing"]


def test_the_command_reports_a_broken_claim_and_exits_1(crm: Crm, broken: str) -> None:
    import asyncio
    import json

    runner = CliRunner()
    tenant = asyncio.run(crm.new_tenant())
    args = ["connector", "test", "crm", "--tenant", str(uuid.uuid4()), "--action",
            "crm.note.create", "--target", tenant.customer_id, "--arguments",
            json.dumps({"customer_id": tenant.customer_id, "body": "cli"}),
            "--token", tenant.token, "--stale-revision", "999"]
    good = runner.invoke(cli.app, [*args, "--url", crm.url, "--json"])
    assert good.exit_code == 0, good.output
    assert all(f["holds"] is not False for f in json.loads(good.output))
    bad = runner.invoke(cli.app, [*args[:2], "crmhttp", *args[3:], "--options",
                                  json.dumps(declared(broken))])
    assert bad.exit_code == 1, bad.output
    assert "FAILS" in bad.output and "dedupes" in bad.output
