"""The CRM connectors without a network (httpx.MockTransport): what they send, how answers
are classified, what they declare (issue 18 §1)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pydantic
import pytest

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


def _client(answer: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request]
            ) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request)
    return httpx.AsyncClient(base_url="http://crm.test", transport=httpx.MockTransport(handler))


def _created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json={"note_id": "n-1", "refund_id": "r-1"})


def _error(status: int, code: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json={"error": {"code": code, "message": "x"}})


async def test_a_note_carries_its_key_and_its_claims_generation() -> None:
    seen: list[httpx.Request] = []
    connector = crm.CrmConnector("http://crm.test", client=_client(_created, seen))
    assert isinstance(await connector.execute(NOTE_CALL, "tok"), base.Applied)
    headers = seen[0].headers
    assert (headers["idempotency-key"], headers["fencing-token"], headers["fencing-key"]) == (
        str(OP), "3", str(OP))


async def test_a_refund_carries_a_fencing_key_and_no_idempotency_key() -> None:
    seen: list[httpx.Request] = []
    connector = crm.BillingConnector("http://crm.test", client=_client(_created, seen))
    assert isinstance(await connector.execute(REFUND_CALL, "tok"), base.Applied)
    headers = seen[0].headers
    assert (headers["fencing-token"], headers["fencing-key"]) == ("7", str(OP))
    assert "idempotency-key" not in headers
    assert json.loads(seen[0].content)["amount_cents"] == 900


async def test_a_call_without_a_generation_sends_no_fencing_headers() -> None:
    seen: list[httpx.Request] = []
    connector = crm.CrmConnector("http://crm.test", client=_client(_created, seen))
    await connector.execute(dataclasses.replace(NOTE_CALL, fencing_generation=None), "tok")
    assert "fencing-token" not in seen[0].headers and "fencing-key" not in seen[0].headers


@pytest.mark.parametrize(("status", "body", "expected"), [
    (409, {"error": {"code": "stale_fencing_token", "message": "x"}}, base.Fenced),
    (409, {"error": {"code": "something_else", "message": "x"}}, base.Refused),
    (409, "not json", base.Refused),
    (422, {"error": {"code": "stale_fencing_token", "message": "x"}}, base.Refused),
    (412, {"error": {"code": "precondition_failed", "message": "x"}}, base.PreconditionFailed),
    (503, {"error": {"code": "storage_unavailable", "message": "x"}}, base.InDoubt),
])
async def test_answers_are_classified(status: int, body: Any, expected: type) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)
    for connector in (crm.CrmConnector("http://crm.test", client=_client(answer, [])),
                      crm.BillingConnector("http://crm.test", client=_client(answer, []))):
        call = NOTE_CALL if connector.name == "crm" else REFUND_CALL
        assert type(await connector.execute(call, "tok")) is expected


def test_both_connectors_declare_fencing_and_a_call_bound_from_their_timeouts() -> None:
    # The bound is every phase of one request once: pool 2 + connect 2 + write 5 + read 5.
    assert crm.CALL_TIMEOUT_S == 14.0
    for connector in (crm.CrmConnector, crm.BillingConnector):
        assert connector.contract.fencing is True
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
