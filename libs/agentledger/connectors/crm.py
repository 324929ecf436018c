"""The CRM and billing connectors, over the CRM service's HTTP API.

Notes and contact updates honour ``Idempotency-Key`` (retention: a day) and can be looked up
by key: contract ``keyed`` with lookup. Refunds are not idempotent at all: contract ``none``.
Every write carries ``Fencing-Token: <generation>`` and ``Fencing-Key: <operation id>``; the
CRM refuses a lower generation than it has seen for the key (409 ``stale_fencing_token``),
so both contracts declare ``fencing``. A refund's ``Fencing-Key`` fences it, never dedupes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import aiohttp

from agentledger import httpclient
from agentledger.connectors import base, plugins

# Phases of one call: waiting for a pooled connection, connecting, writing, reading.
POOL_S, CONNECT_S, WRITE_S, READ_S = 2.0, 2.0, 5.0, 5.0
# The longest one call may take: each phase at most once (a JSON request and answer of a few
# hundred bytes are one write and one read). The client enforces it as the request's total
# and the executor enforces it again around the call; it is under ledger MAX_CALL_S.
CALL_TIMEOUT_S = POOL_S + CONNECT_S + WRITE_S + READ_S
# Connect fast-fail (pool wait and connect): a connection never made proves nothing was
# sent, so it is retried cheaply. The read timeout bounds a silent provider.
TIMEOUT = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S, connect=POOL_S + CONNECT_S,
                                sock_read=READ_S)
# What the CRM answers, with 409, to a generation lower than one it has seen for the key.
STALE_FENCING_TOKEN = "stale_fencing_token"  # noqa: S105 - an error code, not a secret
# The provider documents a 24 h key retention; recovery by resend must happen inside it.
KEY_RETENTION = timedelta(hours=24)


def _receipt(kind: str, body: Mapping[str, Any], key: str) -> str:
    for field in ("note_id", "refund_id"):
        if field in body:
            return f"crm:{kind}:{body[field]}"
    if "revision" in body:
        return f"crm:{kind}:{body.get('customer_id', '?')}@{body['revision']}"
    return f"crm:{kind}:key={key}"


def _error_code(response: httpclient.Answer) -> str | None:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def fencing_headers(call: base.Call) -> dict[str, str]:
    """The claim's generation and the key it fences, for every write (none on a lookup)."""
    if call.fencing_generation is None:
        return {}
    return {"Fencing-Token": str(call.fencing_generation), "Fencing-Key": call.idempotency_key}


def _classify(response: httpclient.Answer, kind: str, key: str) -> base.Result:
    status = response.status
    if status in (200, 201):
        try:
            body = response.json()
        except ValueError:
            return base.InDoubt(f"provider answered {status} with a body that is not JSON")
        return base.Applied(_receipt(kind, body if isinstance(body, dict) else {}, key),
                            replayed=response.headers.get("Idempotent-Replayed") == "true")
    if status in (412, 428):
        return base.PreconditionFailed(f"provider answered {status}: the record changed")
    if status == 409 and _error_code(response) == STALE_FENCING_TOKEN:
        return base.Fenced(f"provider refused a stale fencing token ({STALE_FENCING_TOKEN}): "
                           "a newer claim wrote this key; nothing was applied")
    if 400 <= status < 500:
        return base.Refused(f"provider refused the request ({status})", status)
    return base.InDoubt(f"provider answered {status}")


class _Http:
    def __init__(self, base_url: str) -> None:
        self.client = httpclient.Client(base_url, timeout=TIMEOUT)

    async def send(self, method: str, path: str, token: str, *, kind: str, key: str,
                   json: Mapping[str, Any], headers: Mapping[str, str] | None = None
                   ) -> base.Result:
        try:
            response = await self.client.request(
                method, path, json=json,
                headers={"Authorization": f"Bearer {token}", **(headers or {})},
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # No connection was made (refused, unreachable, no pooled connection in time).
            return base.NotSent(f"connection failed: {type(exc).__name__}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Sent (or partly sent) and no complete answer: the effect may exist (R6.1).
            return base.InDoubt(f"no answer: {type(exc).__name__}")
        return _classify(response, kind, key)


class CrmConnector:
    """crm.note.create and crm.contact.update: keyed, with lookup."""

    name = "crm"
    actions = frozenset({"crm.note.create", "crm.contact.update"})
    contract = base.Contract("keyed", lookup=True, retention=KEY_RETENTION,
                             call_timeout_s=CALL_TIMEOUT_S, fencing=True)
    scopes: frozenset[base.Scope] = frozenset({"write", "lookup"})

    def __init__(self, base_url: str) -> None:
        self._http = _Http(base_url)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        key = call.idempotency_key
        headers = {"Idempotency-Key": key, **fencing_headers(call)}
        if call.expected_revision is not None:
            headers["If-Match"] = f'"{call.expected_revision}"'
        customer = quote(call.arguments["customer_id"], safe="")
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
            response = await self._http.client.request(
                "GET", f"/v1/operations/{quote(call.idempotency_key, safe='')}",
                headers={"Authorization": f"Bearer {token}"},
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return base.InDoubt(f"lookup failed: {type(exc).__name__}")
        if response.status == 404:
            return base.NotFound()
        if response.status != 200:
            return base.InDoubt(f"lookup answered {response.status}")
        try:
            op = response.json()
        except ValueError:
            return base.InDoubt("lookup answered 200 with a body that is not JSON")
        if not isinstance(op, dict):
            return base.InDoubt("lookup answered 200 with a body that is not an object")
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
    contract = base.Contract("none", call_timeout_s=CALL_TIMEOUT_S, fencing=True)
    scopes: frozenset[base.Scope] = frozenset({"write"})

    def __init__(self, base_url: str) -> None:
        self._http = _Http(base_url)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        args = call.arguments
        return await self._http.send(
            "POST", "/v1/refunds", token, kind="refund", key=call.idempotency_key,
            json={"customer_id": args["customer_id"], "invoice_id": args["invoice_id"],
                  "amount_cents": args["amount_minor"], "currency": args["currency"],
                  "reason": args["reason"]},
            # No Idempotency-Key: the CRM would not dedupe refunds by it anyway, and sending
            # one would suggest it does. The fencing key only fences.
            headers=fencing_headers(call))

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return base.InDoubt("billing has no lookup: an operator must reconcile")

    async def aclose(self) -> None:
        await self._http.client.aclose()


def crm(options: Mapping[str, Any]) -> CrmConnector:
    """Entry point ``crm`` of group ``agentledger.connectors``; options: ``url``."""
    return CrmConnector(plugins.url_option("crm", options))


def billing(options: Mapping[str, Any]) -> BillingConnector:
    """Entry point ``billing`` of group ``agentledger.connectors``; options: ``url``."""
    return BillingConnector(plugins.url_option("billing", options))


def registry(crm_url: str) -> dict[str, base.Connector]:
    """Both connectors by name, made directly (tests; the services go through plugins)."""
    return {"crm": crm({"url": crm_url}), "billing": billing({"url": crm_url})}
