"""The CRM and billing connectors, over the CRM service's HTTP API.

Notes and contact updates honour ``Idempotency-Key`` (retention: a day) and can be looked up
by key: contract ``keyed`` with lookup. Refunds are not idempotent at all: contract ``none``.
Every write carries ``Fencing-Token: <generation>`` and ``Fencing-Key: <operation id>``; the
CRM refuses a lower generation than it has seen for the key (409 ``stale_fencing_token``),
so both contracts declare ``fencing``, and ``fence`` advances a key's fence without a write
(``PUT /v1/fences/{key}``). A refund's ``Fencing-Key`` fences it, never dedupes it. Every
write also carries ``Request-Deadline``; the CRM refuses one that arrives later (408
``deadline_passed``: nothing applied), so both declare ``deadline``.

The options ``fencing`` and ``deadline`` (default true) describe a provider that offers
them: ``false`` stands for one that cannot, and the connector then sends no such header and
declares neither (the fault tiers use it for a provider that cannot fence).

What the CRM answers is classified, never trusted (R14): no redirect is followed (a 3xx is in
doubt), a body that is not a JSON object where one is expected is in doubt, a receipt is
built from the answer's own fields only if they are plain scalars, and a 409 under an
idempotency key other than a stale fencing token is in doubt (the IETF Idempotency-Key
draft's "a request with this key is still being processed"), not a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import aiohttp

from agentledger import errors, httpclient
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
# What it answers, with 408, to a write that arrived after its Request-Deadline.
DEADLINE_PASSED = "deadline_passed"
# The provider documents a 24 h key retention; recovery by resend must happen inside it.
KEY_RETENTION = timedelta(hours=24)


def _scalar(value: object) -> str | None:
    """A receipt part from the answer: a plain, non-empty string or a number, else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _receipt(kind: str, body: object, key: str) -> str:
    fields = body if isinstance(body, Mapping) else {}
    for field in ("note_id", "refund_id"):
        if (found := _scalar(fields.get(field))) is not None:
            return f"crm:{kind}:{found}"
    if (revision := _scalar(fields.get("revision"))) is not None:
        return f"crm:{kind}:{_scalar(fields.get('customer_id')) or '?'}@{revision}"
    return f"crm:{kind}:key={key}"


def _error_code(response: httpclient.Answer) -> str | None:
    body = response.json_object()
    error = body.get("error") if body is not None else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def fencing_headers(call: base.Call) -> dict[str, str]:
    """The claim's generation and the key it fences, for every write (none on a lookup)."""
    if call.fencing_generation is None:
        return {}
    return {"Fencing-Token": str(call.fencing_generation), "Fencing-Key": call.idempotency_key}


def _classify(response: httpclient.Answer, kind: str, key: str, *, keyed: bool
              ) -> base.Result:
    status = response.status
    if status in (200, 201):
        body = response.json_object()
        if body is None:
            return base.InDoubt(f"provider answered {status} with a body that is not a JSON "
                                "object")
        return base.Applied(_receipt(kind, body, key),
                            replayed=response.headers.get("Idempotent-Replayed") == "true")
    if 300 <= status < 400:
        # Never followed: a follow-up request's answer is not this write's (R14.1).
        return base.InDoubt(f"provider answered {status} (a redirect, not followed)")
    if status in (412, 428):
        return base.PreconditionFailed(f"provider answered {status}: the record changed")
    code = _error_code(response) if status in (408, 409) else None
    if status == 409 and code == STALE_FENCING_TOKEN:
        return base.Fenced(f"provider refused a stale fencing token ({STALE_FENCING_TOKEN}): "
                           "a newer claim wrote this key; nothing was applied")
    if status == 408 and code == DEADLINE_PASSED:
        return base.NotSent(f"provider refused the request: it arrived past its deadline "
                            f"({DEADLINE_PASSED}); nothing was applied")
    if status == 409 and keyed:
        return base.InDoubt("provider answered 409 under an idempotency key: a request with "
                            "this key may still be in progress")
    if status in (408, 425, 429):
        return base.InDoubt(f"provider answered {status}: not a refusal of the request")
    if 400 <= status < 500:
        return base.Refused(f"provider refused the request ({status})", status)
    return base.InDoubt(f"provider answered {status}")


class _Http:
    def __init__(self, base_url: str, *, fencing: bool = True, deadline: bool = True) -> None:
        self.client = httpclient.Client(base_url, timeout=TIMEOUT)
        self.fencing, self.deadline = fencing, deadline

    def headers(self, call: base.Call) -> dict[str, str]:
        """The fencing and deadline headers this provider honours."""
        return {**(fencing_headers(call) if self.fencing else {}),
                **(call.deadline_header() if self.deadline else {})}

    async def send(self, method: str, path: str, token: str, *, kind: str, key: str,
                   json: Mapping[str, Any], headers: Mapping[str, str] | None = None,
                   keyed: bool = False) -> base.Result:
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
        return _classify(response, kind, key, keyed=keyed)

    async def fence(self, call: base.Call, token: str) -> base.FenceResult:
        """``PUT /v1/fences/{key}`` at ``call.fencing_generation``."""
        if not self.fencing or call.fencing_generation is None:
            return base.NotSent("this provider cannot be fenced")
        key = call.idempotency_key
        try:
            response = await self.client.request(
                "PUT", f"/v1/fences/{httpclient.segment(key)}", headers={
                    "Authorization": f"Bearer {token}",
                    "Fencing-Token": str(call.fencing_generation)})
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return base.NotSent(f"connection failed: {type(exc).__name__}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return base.InDoubt(f"no answer: {type(exc).__name__}")
        body = response.json_object() if response.status == 200 else None
        token_seen = body.get("token") if body is not None else None
        if (body is None or body.get("fencing_key") != key or type(token_seen) is not int):
            return base.InDoubt(f"the fence answered {response.status} without the key's "
                                "fence")
        return base.Advanced(token_seen)


def _contract(idempotency: base.Idempotency, http: _Http, **more: Any) -> base.Contract:
    return base.Contract(idempotency, call_timeout_s=CALL_TIMEOUT_S, fencing=http.fencing,
                         deadline=http.deadline, **more)


class CrmConnector:
    """crm.note.create and crm.contact.update: keyed, with lookup."""

    name = "crm"
    actions = frozenset({"crm.note.create", "crm.contact.update"})
    scopes: frozenset[base.Scope] = frozenset({"write", "lookup"})

    def __init__(self, base_url: str, *, fencing: bool = True, deadline: bool = True) -> None:
        self._http = _Http(base_url, fencing=fencing, deadline=deadline)
        self.contract = _contract("keyed", self._http, lookup=True, retention=KEY_RETENTION)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        key = call.idempotency_key
        headers = {"Idempotency-Key": key, **self._http.headers(call)}
        if call.expected_revision is not None:
            headers["If-Match"] = f'"{call.expected_revision}"'
        try:
            customer = httpclient.segment(str(call.arguments["customer_id"]))
        except ValueError as exc:
            return base.Refused(f"not sent: {exc}", 400)
        if call.action == "crm.note.create":
            return await self._http.send(
                "POST", f"/v1/customers/{customer}/notes", token, kind="note", key=key,
                json={"body": call.arguments["body"]}, headers=headers, keyed=True)
        if call.action == "crm.contact.update":
            return await self._http.send(
                "PATCH", f"/v1/customers/{customer}/contact", token, kind="contact", key=key,
                json=call.arguments["changes"], headers=headers, keyed=True)
        return base.Refused(f"{call.action} is not a CRM action", 400)

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        key = call.idempotency_key
        try:
            response = await self._http.client.request(
                "GET", f"/v1/operations/{httpclient.segment(key)}",
                headers={"Authorization": f"Bearer {token}"},
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return base.InDoubt(f"lookup failed: {type(exc).__name__}")
        if response.status == 404:
            return base.NotFound()
        if response.status != 200:
            return base.InDoubt(f"lookup answered {response.status}")
        op = response.json_object()
        if op is None:
            return base.InDoubt("lookup answered 200 with a body that is not a JSON object")
        if op.get("idempotency_key") != key:
            # Evidence about another key is no evidence about this one (R14.3).
            return base.InDoubt("lookup answered a record of another key")
        kind = "note" if call.action == "crm.note.create" else "contact"
        if op.get("status") in (200, 201) and type(op.get("status")) is int:
            return base.Applied(_receipt(kind, op.get("response"), key), replayed=True)
        return base.InDoubt(f"the provider recorded status {op.get('status')!r:.40} for this key")

    async def fence(self, call: base.Call, token: str) -> base.FenceResult:
        return await self._http.fence(call, token)

    async def aclose(self) -> None:
        await self._http.client.aclose()


class BillingConnector:
    """billing.refund.create: NOT idempotent; a lost answer is `unknown`, never resent."""

    name = "billing"
    actions = frozenset({"billing.refund.create"})
    # No lookup, but the lookup-scoped token advances the fence (a take-over, a resolution).
    scopes: frozenset[base.Scope] = frozenset({"write", "lookup"})

    def __init__(self, base_url: str, *, fencing: bool = True, deadline: bool = True) -> None:
        self._http = _Http(base_url, fencing=fencing, deadline=deadline)
        self.contract = _contract("none", self._http)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        args = call.arguments
        return await self._http.send(
            "POST", "/v1/refunds", token, kind="refund", key=call.idempotency_key,
            json={"customer_id": args["customer_id"], "invoice_id": args["invoice_id"],
                  "amount_cents": args["amount_minor"], "currency": args["currency"],
                  "reason": args["reason"]},
            # No Idempotency-Key: the CRM would not dedupe refunds by it anyway, and sending
            # one would suggest it does. The fencing key only fences.
            headers=self._http.headers(call))

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return base.InDoubt("billing has no lookup: an operator must reconcile")

    async def fence(self, call: base.Call, token: str) -> base.FenceResult:
        return await self._http.fence(call, token)

    async def aclose(self) -> None:
        await self._http.client.aclose()


def _flag(name: str, options: Mapping[str, Any], key: str) -> bool:
    value = options.get(key, True)
    if not isinstance(value, bool):
        raise errors.ConfigurationError(f"connector {name!r}: option {key!r} must be true or "
                                        "false", connector=name)
    return value


def crm(options: Mapping[str, Any]) -> CrmConnector:
    """Entry point ``crm`` of group ``agentledger.connectors``; options: ``url``,
    ``fencing`` and ``deadline`` (default true)."""
    return CrmConnector(plugins.url_option("crm", options),
                        fencing=_flag("crm", options, "fencing"),
                        deadline=_flag("crm", options, "deadline"))


def billing(options: Mapping[str, Any]) -> BillingConnector:
    """Entry point ``billing`` of group ``agentledger.connectors``; options: ``url``,
    ``fencing`` and ``deadline`` (default true)."""
    return BillingConnector(plugins.url_option("billing", options),
                            fencing=_flag("billing", options, "fencing"),
                            deadline=_flag("billing", options, "deadline"))


def registry(crm_url: str) -> dict[str, base.Connector]:
    """Both connectors by name, made directly (tests; the services go through plugins)."""
    return {"crm": crm({"url": crm_url}), "billing": billing({"url": crm_url})}
