"""The CRM connectors against a provider stand-in on loopback: what they send, how answers
are classified, what they declare (issue 18 §1)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pydantic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentledger.connectors import base, crm
from agentledger.executor import dispatcher
from agentledger.ledger import dispatch
from agentledger.services.executor.settings import ExecutorSettings

OP = uuid.uuid4()
NOTE_CALL = base.Call(uuid.uuid4(), OP, "crm.note.create", "c-1",
                      {"customer_id": "c-1", "body": "hello"}, None, fencing_generation=3)
REFUND_CALL = base.Call(uuid.uuid4(), OP, "billing.refund.create", "c-1",
                        {"customer_id": "c-1", "invoice_id": "inv-1", "amount_minor": 900,
                         "currency": "EUR", "reason": "late"}, None, fencing_generation=7)


@dataclasses.dataclass
class Seen:
    method: str
    path: str
    headers: Any
    body: bytes


Answer = Callable[[Seen], web.Response]


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A provider on loopback answering every request with ``answer``; what it saw."""
    seen: list[Seen] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(Seen(request.method, request.path, request.headers, await request.read()))
        return answer(seen[-1])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")), seen
    finally:
        await server.close()


def _created(_seen: Seen) -> web.Response:
    return web.json_response({"note_id": "n-1", "refund_id": "r-1"}, status=201)


async def test_a_note_carries_its_key_and_its_claims_generation() -> None:
    async with serving(_created) as (url, seen):
        connector = crm.CrmConnector(url)
        assert isinstance(await connector.execute(NOTE_CALL, "tok"), base.Applied)
        await connector.aclose()
    headers = seen[0].headers
    assert (seen[0].method, seen[0].path) == ("POST", "/v1/customers/c-1/notes")
    assert (headers["idempotency-key"], headers["fencing-token"], headers["fencing-key"]) == (
        str(OP), "3", str(OP))
    assert headers["authorization"] == "Bearer tok" and json.loads(seen[0].body) == {"body": "hello"}


async def test_a_refund_carries_a_fencing_key_and_no_idempotency_key() -> None:
    async with serving(_created) as (url, seen):
        connector = crm.BillingConnector(url)
        assert isinstance(await connector.execute(REFUND_CALL, "tok"), base.Applied)
        await connector.aclose()
    headers = seen[0].headers
    assert (headers["fencing-token"], headers["fencing-key"]) == ("7", str(OP))
    assert "idempotency-key" not in headers
    assert json.loads(seen[0].body)["amount_cents"] == 900


async def test_a_call_without_a_generation_sends_no_fencing_headers() -> None:
    async with serving(_created) as (url, seen):
        connector = crm.CrmConnector(url)
        await connector.execute(dataclasses.replace(NOTE_CALL, fencing_generation=None), "tok")
        await connector.aclose()
    assert "fencing-token" not in seen[0].headers and "fencing-key" not in seen[0].headers


# (status, body, what the CRM connector makes of it, what the billing connector does). A note
# carries an idempotency key, a refund none: a 409 under a key is the IETF draft's "still in
# progress" — in doubt, never a refusal (issue 38 class 6; on 85a9f05: Refused).
@pytest.mark.parametrize(("status", "body", "note", "refund"), [
    (409, {"error": {"code": "stale_fencing_token", "message": "x"}}, base.Fenced, base.Fenced),
    (409, {"error": {"code": "something_else", "message": "x"}}, base.InDoubt, base.Refused),
    (409, "not json", base.InDoubt, base.Refused),
    (408, {"error": {"code": "deadline_passed", "message": "x"}}, base.NotSent, base.NotSent),
    (408, "timeout", base.InDoubt, base.InDoubt),
    (429, "slow down", base.InDoubt, base.InDoubt),
    (422, {"error": {"code": "stale_fencing_token", "message": "x"}}, base.Refused, base.Refused),
    (412, {"error": {"code": "precondition_failed", "message": "x"}}, base.PreconditionFailed,
     base.PreconditionFailed),
    (503, {"error": {"code": "storage_unavailable", "message": "x"}}, base.InDoubt, base.InDoubt),
    (201, "applied, but not json", base.InDoubt, base.InDoubt),
    (201, [1, 2], base.InDoubt, base.InDoubt),
    (201, None, base.InDoubt, base.InDoubt),
    (202, {"note_id": "n-1"}, base.InDoubt, base.InDoubt),
])
async def test_answers_are_classified(status: int, body: Any, note: type, refund: type) -> None:
    def answer(_seen: Seen) -> web.Response:
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)
    async with serving(answer) as (url, _seen):
        for connector in (crm.CrmConnector(url), crm.BillingConnector(url)):
            call = NOTE_CALL if connector.name == "crm" else REFUND_CALL
            expected = note if connector.name == "crm" else refund
            assert type(await connector.execute(call, "tok")) is expected
            await connector.aclose()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_never_followed_nor_taken_as_the_answer(status: int) -> None:
    # Issue 38 class 1 (on 85a9f05 a 302 after the POST became a GET whose 201 was Applied,
    # and a 307 replayed the POST and its credentials to the Location).
    async with serving(_created) as (elsewhere, followed):
        def redirect(_seen: Seen) -> web.Response:
            return web.Response(status=status,
                                headers={"Location": f"{elsewhere.rstrip('/')}/v1/x"})
        async with serving(redirect) as (url, seen):
            for connector in (crm.CrmConnector(url), crm.BillingConnector(url)):
                call = NOTE_CALL if connector.name == "crm" else REFUND_CALL
                assert isinstance(await connector.execute(call, "tok"), base.InDoubt)
                assert isinstance(await connector.lookup(call, "tok"), base.InDoubt)
                await connector.aclose()
    assert len(seen) == 3 and followed == []  # two writes and a lookup; nothing followed


@pytest.mark.parametrize("body", [
    b"\xff\xfe not utf-8", b'{"note_id": "n', b"[]", b"null", b'"a string"',
    json.dumps({"note_id": {"nested": ["x"] * 3}}).encode(),
    json.dumps({"note_id": "n\u0000" + "x" * 5000}).encode(),
])
async def test_a_hostile_body_is_in_doubt_or_a_storable_receipt(body: bytes) -> None:
    # Issue 38 classes 2 and 3: whatever the bytes, a result the ledger can store (through
    # the boundary every caller uses), never an exception.
    from agentledger.connectors import boundary
    from agentledger.contracts import outcomes

    async with serving(lambda _s: web.Response(status=201, body=body)) as (url, _seen):
        connector = crm.CrmConnector(url)
        found = await boundary.execute(connector, NOTE_CALL, "tok", bound_s=5)
        looked = await boundary.lookup(connector, NOTE_CALL, "tok", bound_s=5)
        await connector.aclose()
    assert isinstance(found, base.Applied | base.InDoubt)
    if isinstance(found, base.Applied):
        outcomes.Succeeded(receipt=found.receipt)  # storable, bounded, non-empty
    assert isinstance(looked, base.InDoubt)  # 201 is no lookup answer


async def test_a_customer_id_that_is_a_dot_segment_is_refused_before_anything_is_sent() -> None:
    # Issue 38 class 4: ".." resolved by the URL library would send the note to another route.
    async with serving(_created) as (url, seen):
        connector = crm.CrmConnector(url)
        for bad in ("..", "."):
            call = dataclasses.replace(NOTE_CALL, arguments={"customer_id": bad, "body": "x"})
            assert isinstance(await connector.execute(call, "tok"), base.Refused)
        await connector.aclose()
    assert seen == []


async def test_every_write_carries_its_deadline_unless_the_provider_cannot_honour_one() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 12, 6, 5, 0, 0, 123000, tzinfo=UTC)
    async with serving(_created) as (url, seen):
        honours, cannot = crm.BillingConnector(url), crm.BillingConnector(url, deadline=False,
                                                                           fencing=False)
        for connector in (honours, cannot):
            await connector.execute(dataclasses.replace(REFUND_CALL, deadline=at), "tok")
            await connector.aclose()
    assert seen[0].headers["request-deadline"] == "2026-12-06T05:00:00.123Z"
    assert "request-deadline" not in seen[1].headers and "fencing-token" not in seen[1].headers
    assert (honours.contract.fencing, honours.contract.deadline) == (True, True)
    assert (cannot.contract.fencing, cannot.contract.deadline) == (False, False)


async def test_a_fence_is_advanced_without_a_write_and_checked() -> None:
    def answer(seen: Seen) -> web.Response:
        return web.json_response({"fencing_key": str(OP), "token": int(seen.headers["fencing-token"])})
    async with serving(answer) as (url, seen):
        connector = crm.BillingConnector(url)
        assert await connector.fence(dataclasses.replace(REFUND_CALL, fencing_generation=9),
                                     "lookup-tok") == base.Advanced(9)
        await connector.aclose()
    assert (seen[0].method, seen[0].path) == ("PUT", f"/v1/fences/{OP}")
    assert seen[0].headers["fencing-token"] == "9" and seen[0].body == b""

    def another_key(_seen: Seen) -> web.Response:
        return web.json_response({"fencing_key": "someone-else", "token": 99})
    async with serving(another_key) as (url, _seen):
        connector = crm.BillingConnector(url)
        assert isinstance(await connector.fence(REFUND_CALL, "tok"), base.InDoubt)
        await connector.aclose()


async def test_a_refused_connection_is_not_sent_and_a_dropped_answer_is_in_doubt() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    connector = crm.CrmConnector(closed)
    assert isinstance(await connector.execute(NOTE_CALL, "tok"), base.NotSent)
    await connector.aclose()

    def hang_up(_seen: Seen) -> web.Response:
        raise ConnectionResetError("the provider went away after reading the request")
    async with serving(hang_up) as (url, seen):
        connector = crm.CrmConnector(url)
        assert isinstance(await connector.execute(NOTE_CALL, "tok"), base.InDoubt)
        await connector.aclose()
    assert len(seen) == 1  # it arrived: in doubt, never "not sent"


async def test_a_lookup_finds_the_effect_or_says_it_is_not_there() -> None:
    def answer(seen: Seen) -> web.Response:
        if seen.path.endswith(str(OP)):
            return web.json_response({"idempotency_key": str(OP), "status": 201,
                                      "response": {"note_id": "n-9"}})
        return web.json_response({"error": {"code": "not_found"}}, status=404)
    async with serving(answer) as (url, seen):
        connector = crm.CrmConnector(url)
        found = await connector.lookup(NOTE_CALL, "tok")
        missing = await connector.lookup(dataclasses.replace(NOTE_CALL, operation_id=uuid.uuid4()), "tok")
        await connector.aclose()
    assert found == base.Applied("crm:note:n-9", replayed=True) and isinstance(missing, base.NotFound)
    assert seen[0].path == f"/v1/operations/{OP}" and seen[0].method == "GET"


async def test_a_lookup_answering_another_keys_record_is_no_evidence() -> None:
    # A misrouted or hostile answer about another key must not settle this one (R14.3).
    def answer(_seen: Seen) -> web.Response:
        return web.json_response({"idempotency_key": "another", "status": 201,
                                  "response": {"note_id": "n-9"}})
    async with serving(answer) as (url, _seen):
        connector = crm.CrmConnector(url)
        assert isinstance(await connector.lookup(NOTE_CALL, "tok"), base.InDoubt)
        await connector.aclose()


def test_both_connectors_declare_fencing_and_a_call_bound_from_their_timeouts() -> None:
    # The bound is every phase of one request once: pool 2 + connect 2 + write 5 + read 5.
    assert crm.CALL_TIMEOUT_S == 14.0
    for connector in (crm.CrmConnector("http://crm.test"), crm.BillingConnector("http://crm.test")):
        assert connector.contract.fencing is True and connector.contract.deadline is True
        assert connector.contract.call_timeout_s == crm.CALL_TIMEOUT_S <= dispatch.MAX_CALL_S


def test_a_contract_must_declare_a_positive_call_bound() -> None:
    with pytest.raises(TypeError):
        base.Contract("none")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="positive"):
        base.Contract("none", call_timeout_s=0)
    assert base.Contract("keyed", call_timeout_s=1).fencing is False  # opt-in


def _dispatcher(**overrides: Any) -> dispatcher.Dispatcher:
    fields: dict[str, Any] = {
        "pool": None, "connectors": crm.registry("http://crm.test"),
        "credentials": base.Credentials("write"), "cipher": None, "authorizer": None,
        "allowlist": None, "worker_id": "w", **overrides}
    return dispatcher.Dispatcher(**fields)


def test_the_dispatcher_refuses_a_call_bound_past_the_ledgers_window() -> None:
    assert _dispatcher().call_bound(crm.CrmConnector("http://crm.test")) == crm.CALL_TIMEOUT_S
    assert _dispatcher(call_timeout_s=2.0).call_bound(crm.CrmConnector("http://crm.test")) == 2.0
    with pytest.raises(ValueError, match="MAX_CALL_S"):
        _dispatcher(call_timeout_s=dispatch.MAX_CALL_S + 1)


def test_the_executor_setting_overrides_the_bound_within_the_ledgers_window() -> None:
    required = {"AGENTLEDGER_DATABASE_URL": "postgresql://x", "AGENTLEDGER_KAFKA_BOOTSTRAP": "k:9",
                "AGENTLEDGER_MASTER_KEY": "k"}
    assert ExecutorSettings.model_validate(required).call_timeout_s is None
    assert ExecutorSettings.model_validate(
        {**required, "AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S": "2"}).call_timeout_s == 2.0
    with pytest.raises(pydantic.ValidationError):
        ExecutorSettings.model_validate(
            {**required, "AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S": str(dispatch.MAX_CALL_S + 1)})
