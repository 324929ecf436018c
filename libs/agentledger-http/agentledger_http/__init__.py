"""A declarative HTTP connector: a REST API integrated by configuration alone.

Each action is a request template (method, path, JSON body built from the command's target,
key and arguments). The command's operation id is sent as the idempotency key header, and
the expected revision as ``If-Match``. The configuration says which statuses mean applied,
precondition failed, not sent or in doubt. A lookup URL answers what happened to a key, and
a resolve URL gives admission the target's revision (R1.4). The connector name, its actions
and its contract are all the operator's declaration: ``agentledger connector test`` checks
the declaration against the real API.

The answers of a declared API are classified, never trusted (R14): redirects are not
followed (a 3xx is in doubt), bodies are read as bytes up to a bound (not UTF-8, not an
object, too long: in doubt), a templated path segment that is a dot segment is refused before
anything is sent, and a lookup settles only on an answer whose declared ``identifies``
fields name this operation's effect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote
from uuid import UUID

import aiohttp

from agentledger import errors, httpclient
from agentledger.connectors import (
    Advanced,
    Applied,
    Call,
    Fenced,
    FenceResult,
    InDoubt,
    Lookup,
    NotFound,
    NotSent,
    PreconditionFailed,
    Refused,
    Result,
    Scope,
)
from agentledger.connectors.base import format_deadline
from agentledger.resources import Resource, not_found
from agentledger_http import config


class HttpConnector:
    """The actions of one REST API, as its configuration declares them."""

    def __init__(self, api: config.Api) -> None:
        self.api = api
        self.name = api.name
        self.actions = frozenset(api.actions)
        self.contract = api.contract()
        self.scopes: frozenset[Scope] = frozenset(
            {"write", "lookup"} if api.lookup is not None else {"write"})
        self._session: aiohttp.ClientSession | None = None

    async def execute(self, call: Call, token: str) -> Result:
        action = self.api.actions.get(call.action)
        if action is None:
            return Refused(f"{call.action} is not an action of {self.name}", 400)
        headers = {**self.api.auth(token), self.api.idempotency_header: call.idempotency_key}
        if action.if_match and call.expected_revision is not None:
            headers["If-Match"] = f'"{call.expected_revision}"'
        if self.api.fencing is not None and call.fencing_generation is not None:
            headers[self.api.fencing.token_header] = str(call.fencing_generation)
            headers[self.api.fencing.key_header] = call.idempotency_key
        if self.api.deadline is not None and call.deadline is not None:
            headers[self.api.deadline.header] = format_deadline(call.deadline)
        values = _values(call)
        try:
            url = self.api.url(action.path, values)
        except ValueError as exc:
            return Refused(f"not sent: {exc}", 400)
        try:
            async with self._client().request(
                    action.method, url, headers=headers, allow_redirects=False,
                    json=config.fill(action.body, values) if action.body is not None
                    else dict(call.arguments)) as answer:
                status = answer.status
                body, truncated = await httpclient.read_body(answer)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return NotSent(f"connection failed: {type(exc).__name__}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return InDoubt(f"no answer: {type(exc).__name__}")
        return self._classify(action, status, None if truncated else body, values)

    def _classify(self, action: config.Action, status: int, body: bytes | None,
                  values: dict[str, Any]) -> Result:
        """``body`` None: it was longer than the client reads."""
        s, text = self.api.statuses, (body or b"").decode("utf-8", "replace")
        if status in s.applied:
            found = None if body is None else config.json_object(body)
            if found is None:
                return InDoubt(f"{status} with a body that is not a JSON object")
            return Applied(config.render(action.receipt, {**values, "response": found}))
        if 300 <= status < 400:
            # Never followed: a follow-up request's answer is not this write's (R14.1).
            return InDoubt(f"the API answered {status} (a redirect, not followed)")
        if status in s.precondition_failed:
            return PreconditionFailed(f"the API answered {status}: the record changed")
        if (self.api.fencing is not None and status == self.api.fencing.refused_status
                and self.api.fencing.refused_code in text):
            return Fenced(f"the API refused a stale fencing token ({status})")
        if (self.api.deadline is not None and status == self.api.deadline.refused_status
                and self.api.deadline.refused_code in text):
            return NotSent(f"the API refused the request past its deadline ({status}): "
                           "nothing applied")
        if status in s.not_sent:
            return NotSent(f"the API answered {status}: nothing applied, try again later")
        if status in s.in_doubt or status >= 500:
            return InDoubt(f"the API answered {status}")
        if 400 <= status < 500:
            return Refused(f"the API refused the request ({status})", status)
        return InDoubt(f"the API answered {status}")

    async def lookup(self, call: Call, token: str) -> Lookup:
        how = self.api.lookup
        if how is None:
            return InDoubt(f"{self.name} declares no lookup")
        values = _values(call)
        try:
            url = self.api.url(how.path, values)
        except ValueError as exc:
            return InDoubt(f"lookup not sent: {exc}")
        try:
            async with self._client().get(url, headers=self.api.auth(token),
                                          allow_redirects=False) as answer:
                status = answer.status
                body, truncated = await httpclient.read_body(answer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return InDoubt(f"lookup failed: {type(exc).__name__}")
        if status in how.not_found:
            return NotFound()
        if status not in how.found:
            return InDoubt(f"lookup answered {status}")
        found = None if truncated else config.json_object(body)
        if found is None:
            return InDoubt("lookup answered with a body that is not a JSON object")
        if how.applied_when is not None and found.get(how.applied_when.field) not in (
                how.applied_when.values):
            return InDoubt(f"the API recorded {how.applied_when.field}="
                           f"{found.get(how.applied_when.field)!r:.60} for this key")
        for path, template in how.identifies.items():
            wanted = config.render(template, values)
            if str(config.field(found, path)) != wanted or config.field(found, path) is None:
                # A record that does not name this operation's effect is no evidence of it.
                return InDoubt(f"the lookup's answer does not identify this operation's effect "
                               f"({path} is not {wanted!r:.60})")
        return Applied(config.render(how.receipt, {**values, "response": found}), replayed=True)

    async def fence(self, call: Call, token: str) -> FenceResult:
        """Advance the API's fence for the key, as its declaration says (``fencing.advance``)."""
        fencing = self.api.fencing
        if fencing is None or call.fencing_generation is None:
            return NotSent(f"{self.name} declares no fencing")
        try:
            url = self.api.url(fencing.advance.path, _values(call))
        except ValueError as exc:
            return NotSent(f"fence not sent: {exc}")
        headers = {**self.api.auth(token), fencing.token_header: str(call.fencing_generation),
                   fencing.key_header: call.idempotency_key}
        try:
            async with self._client().request(fencing.advance.method, url, headers=headers,
                                              allow_redirects=False) as answer:
                status = answer.status
                body, truncated = await httpclient.read_body(answer)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return NotSent(f"connection failed: {type(exc).__name__}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return InDoubt(f"no answer: {type(exc).__name__}")
        if not 200 <= status < 300:
            return InDoubt(f"the fence answered {status}")
        if fencing.advance.token_field is None:
            return Advanced(call.fencing_generation)
        seen = config.field(config.json_object(body) or {}, fencing.advance.token_field)
        if truncated or type(seen) is not int:
            return InDoubt(f"the fence's answer has no integer {fencing.advance.token_field}")
        return Advanced(seen)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                self.api.base_url, timeout=aiohttp.ClientTimeout(
                    total=self.api.call_timeout_s, connect=min(2.0, self.api.call_timeout_s)))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpResolver:
    """Admission's check of a target: a GET of the resolve URL with the tenant's read token."""

    def __init__(self, api: config.Api, read_tokens: Mapping[str, str]) -> None:
        self.api, self.tokens = api, dict(read_tokens)
        self._session: aiohttp.ClientSession | None = None

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        how, token = self.api.resolve, self.tokens.get(str(tenant_id))
        if how is None or token is None:
            raise not_found(resource_id)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                self.api.base_url, timeout=aiohttp.ClientTimeout(total=self.api.call_timeout_s))
        values = {"target": quote(resource_id, safe="")}
        try:
            url = self.api.url(how.path, values, quoted=True)
        except ValueError:
            raise not_found(resource_id) from None
        try:
            async with self._session.get(url, headers=self.api.auth(token),
                                         allow_redirects=False) as answer:
                status, etag = answer.status, answer.headers.get("ETag")
                raw, truncated = await httpclient.read_body(answer)
                text = "" if truncated else raw.decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise errors.StorageError(f"resolving the target failed: {type(exc).__name__}",
                                      connector=connector) from exc
        if status in how.not_found:
            raise not_found(resource_id)
        if status != 200:
            raise errors.StorageError(f"resolving the target answered {status}",
                                      connector=connector)
        body = config.json_object(text) or {}
        revision = (body.get(how.revision_field) if how.revision_field
                    else (etag or "").strip('"') or None)
        return Resource(connector, resource_id, None if revision is None else str(revision))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _values(call: Call) -> dict[str, Any]:
    return {"target": call.resource_id, "key": call.idempotency_key,
            "arguments": dict(call.arguments), "revision": call.expected_revision}


def example(name: str, **values: str) -> dict[str, Any]:
    """A shipped example declaration (``examples/<name>.json``), its ``{placeholders}`` filled:
    ``crm_notes`` declares the CRM stand-in's note API (``crm_url``)."""
    from importlib import resources

    text = resources.files("agentledger_http").joinpath("examples", f"{name}.json").read_text()
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    found: dict[str, Any] = json.loads(text)
    return found


def connector(options: Mapping[str, Any]) -> HttpConnector:
    """The factory (``agentledger_http:connector``): options as in ``config.Api``."""
    return HttpConnector(config.parse(options))


def resolver(options: Mapping[str, Any], read_tokens: Mapping[str, str]) -> HttpResolver:
    """The resolver factory (``agentledger_http:resolver``)."""
    return HttpResolver(config.parse(options), read_tokens)


__all__ = ["HttpConnector", "HttpResolver", "connector", "example", "resolver"]
