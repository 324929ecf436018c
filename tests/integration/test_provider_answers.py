"""A provider's answer can never make the ledger's write fail, nor raise out of a connector
(issue 38 classes 2 and 3), through the real executor and reconciler on the real ledger.

On 85a9f05 a receipt holding U+0000 (or longer than the ledger keeps, or empty) raised inside
`finalize` after the provider had applied the effect: the command stayed `dispatching`, the
reconciler took it over, looked it up, got the same receipt and raised again, forever. And a
search answer of the wrong JSON type raised AttributeError out of the e-mail lookup.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentledger.connectors import InDoubt, NotFound, crm, plugins
from agentledger.contracts import outcomes
from tests.integration import executor_world
from tests.integration.executor_world import World

NOTE = "crm.note.create"

# The module's CRM fixture registers as `crm` whatever it is bound to here.
crm_fixture, world = executor_world.fixtures()


@contextlib.asynccontextmanager
async def stand_in(answer: Callable[[web.Request], web.Response]) -> AsyncIterator[str]:
    app = web.Application()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return answer(request)
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.mark.parametrize("receipt", ["n-1\u0000evil", "r" * 5000, ""], ids=["nul", "huge", "empty"])
async def test_an_applied_effect_with_an_unstorable_receipt_is_recorded(
    world: World, receipt: str,
) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "a hostile receipt"})

    def applied(request: web.Request) -> web.Response:
        if request.method == "GET":  # the reconciler's lookup, should it come to that
            return web.json_response({"idempotency_key": str(op), "status": 201,
                                      "response": {"note_id": receipt}})
        return web.json_response({"note_id": receipt}, status=201)

    async with stand_in(applied) as url:
        await world.connectors["crm"].aclose()
        world.connectors["crm"] = crm.CrmConnector(url)
        begun = await world.dispatcher().begin(t.tenant_id, op)
        assert begun.claim is not None
        assert await world.dispatcher().complete(begun.claim) == "succeeded"
    row = await world.row(t, op)
    assert row["state"] == "succeeded"
    stored = row["provider_receipt"]
    outcomes.Succeeded(receipt=stored)  # storable, bounded, non-empty
    assert "\x00" not in stored and len(stored) <= outcomes.RECEIPT_MAX
    if receipt == "":  # a provider that named nothing: the key, said so
        assert stored == f"crm:note:key={op}", stored
    async with world.owner.acquire() as conn:
        events = await conn.fetch("SELECT payload FROM audit_event WHERE operation_id = $1 "
                                  "AND type = 'command.succeeded'", op)
    assert len(events) == 1  # recorded once: no take-over loop


@pytest.mark.parametrize("body", [b"[]", b"null", b"\xff\xfe\x00", b'{"messages": "x"}',
                                  b'{"messages": [1, "a", null]}'])
async def test_a_malformed_search_answer_is_in_doubt_never_an_exception(body: bytes) -> None:
    def answer(_request: web.Request) -> web.Response:
        return web.Response(status=200, body=body, content_type="application/json")

    async with stand_in(answer) as url:
        connector = plugins.make("email", {
            "smtp_host": "127.0.0.1", "smtp_port": 1, "sender": "agent@acme.test",
            "lookup_url": url, "deployment_id": "answers"})
        try:
            call = _call()
            found = await connector.lookup(call, "")
        finally:
            await connector.aclose()
    assert isinstance(found, InDoubt | NotFound), found
    if body in (b"[]", b"null", b"\xff\xfe\x00", b'{"messages": "x"}'):
        assert isinstance(found, InDoubt), found


def _call() -> Any:
    from agentledger.connectors import Call

    return Call(uuid.uuid4(), uuid.uuid4(), "email.send", "ada@example.com",
                {"subject": "s", "body": "b"}, None)
