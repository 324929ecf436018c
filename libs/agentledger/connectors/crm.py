"""The CRM and billing connectors, over the CRM service's HTTP API.

Notes and contact updates honour ``Idempotency-Key`` (retention: a day) and can be looked up
by key: contract ``keyed`` with lookup. Refunds are not idempotent at all: contract ``none``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import httpx

from agentledger.connectors import base

# Connect fast-fail: a refused connection proves nothing was sent, so it is retried cheaply.
# The read timeout bounds a silent provider; the whole call is bounded by CALL_TIMEOUT_S.
TIMEOUT = httpx.Timeout(connect=2.0, read=5.0, write=5.0, pool=2.0)
# The longest one call may take: each phase at most once (a JSON request and answer of a few
# hundred bytes are one write and one read). httpx's read timeout bounds inactivity, not the
# whole answer, so the executor enforces this total itself; it is under ledger MAX_CALL_S.
CALL_TIMEOUT_S = sum(t or 0.0 for t in (TIMEOUT.pool, TIMEOUT.connect, TIMEOUT.write,
                                        TIMEOUT.read))
# The provider documents a 24 h key retention; recovery by resend must happen inside it.
KEY_RETENTION = timedelta(hours=24)


def _receipt(kind: str, body: Mapping[str, Any], key: str) -> str:
    for field in ("note_id", "refund_id"):
        if field in body:
            return f"crm:{kind}:{body[field]}"
    if "revision" in body:
        return f"crm:{kind}:{body.get('customer_id', '?')}@{body['revision']}"
    return f"crm:{kind}:key={key}"


def _classify(response: httpx.Response, kind: str, key: str) -> base.Result:
    status = response.status_code
    if status in (200, 201):
        return base.Applied(_receipt(kind, response.json(), key),
                            replayed=response.headers.get("Idempotent-Replayed") == "true")
    if status in (412, 428):
        return base.PreconditionFailed(f"provider answered {status}: the record changed")
    if 400 <= status < 500:
        return base.Refused(f"provider refused the request ({status})", status)
    return base.InDoubt(f"provider answered {status}")


class _Http:
    def __init__(self, base_url: str, client: httpx.AsyncClient | None) -> None:
        self.client = client or httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT)

    async def send(self, method: str, path: str, token: str, *, kind: str, key: str,
                   json: Mapping[str, Any], headers: Mapping[str, str] | None = None
                   ) -> base.Result:
        try:
            response = await self.client.request(
                method, path, json=dict(json),
                headers={"Authorization": f"Bearer {token}", **(headers or {})},
            )
        except httpx.ConnectError as exc:
            return base.NotSent(f"connection failed: {type(exc).__name__}")
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            # Sent (or partly sent) and no complete answer: the effect may exist (R6.1).
            return base.InDoubt(f"no answer: {type(exc).__name__}")
        return _classify(response, kind, key)


class CrmConnector:
    """crm.note.create and crm.contact.update: keyed, with lookup."""

    name = "crm"
    actions = frozenset({"crm.note.create", "crm.contact.update"})
    contract = base.Contract("keyed", lookup=True, retention=KEY_RETENTION,
                             call_timeout_s=CALL_TIMEOUT_S)
    scopes: frozenset[base.Scope] = frozenset({"write", "lookup"})

    def __init__(self, base_url: str, *, client: httpx.AsyncClient | None = None) -> None:
        self._http = _Http(base_url, client)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        key = call.idempotency_key
        headers = {"Idempotency-Key": key}
        if call.expected_revision is not None:
            headers["If-Match"] = f'"{call.expected_revision}"'
        customer = call.arguments["customer_id"]
        if call.action == "crm.note.create":
            return await self._http.send(
                "POST", f"/v1/customers/{customer}/notes", token, kind="note", key=key,
                json={"body": call.arguments["body"]}, headers=headers)
        if call.action == "crm.contact.update":
            return await self._http.send(
                "PATCH", f"/v1/customers/{customer}/contact", token, kind="contact", key=key,
                json=call.arguments["changes"], headers=headers)
        return base.Refused(f"{call.action} is not a CRM action", 400)

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        try:
            response = await self._http.client.get(
                f"/v1/operations/{call.idempotency_key}",
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            return base.InDoubt(f"lookup failed: {type(exc).__name__}")
        if response.status_code == 404:
            return base.NotFound()
        if response.status_code != 200:
            return base.InDoubt(f"lookup answered {response.status_code}")
        op = response.json()
        kind = "note" if call.action == "crm.note.create" else "contact"
        if op.get("status") in (200, 201):
            return base.Applied(_receipt(kind, op.get("response") or {}, call.idempotency_key),
                                replayed=True)
        return base.InDoubt(f"the provider recorded status {op.get('status')} for this key")

    async def aclose(self) -> None:
        await self._http.client.aclose()


class BillingConnector:
    """billing.refund.create: NOT idempotent; a lost answer is `unknown`, never resent."""

    name = "billing"
    actions = frozenset({"billing.refund.create"})
    contract = base.Contract("none", call_timeout_s=CALL_TIMEOUT_S)
    scopes: frozenset[base.Scope] = frozenset({"write"})

    def __init__(self, base_url: str, *, client: httpx.AsyncClient | None = None) -> None:
        self._http = _Http(base_url, client)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        args = call.arguments
        return await self._http.send(
            "POST", "/v1/refunds", token, kind="refund", key=call.idempotency_key,
            json={"customer_id": args["customer_id"], "invoice_id": args["invoice_id"],
                  "amount_cents": args["amount_minor"], "currency": args["currency"],
                  "reason": args["reason"]})

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return base.InDoubt("billing has no lookup: an operator must reconcile")

    async def aclose(self) -> None:
        await self._http.client.aclose()


def registry(crm_url: str) -> dict[str, base.Connector]:
    """The connectors by name."""
    return {"crm": CrmConnector(crm_url), "billing": BillingConnector(crm_url)}
