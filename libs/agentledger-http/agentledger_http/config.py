"""The declaration of one REST API, validated when the connector is made.

Templates name the command's values in braces: ``{target}``, ``{key}`` (the idempotency key,
the operation id), ``{revision}``, ``{arguments.NAME}`` and, in receipts, ``{response.NAME}``
(a field of the JSON answer; ``{response.a.b}`` for a nested one). A JSON body template uses
the same values as ``"$target"``, ``"$key"``, ``"$arguments.NAME"``. Written here, not with
``str.format``: format strings can reach attributes, and these are a closed set of names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentledger import errors
from agentledger.connectors import Contract

_NAME = r"^[a-z][a-z0-9_]*$"
_PLACE = re.compile(r"\{([a-z]+)((?:\.[A-Za-z0-9_]+)*)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Action(_Strict):
    method: Literal["POST", "PUT", "PATCH", "DELETE"] = "POST"
    path: str = Field(pattern=r"^/")
    # The JSON body; None sends the command's arguments as they are.
    body: dict[str, Any] | None = None
    if_match: bool = False  # send the expected revision as If-Match
    receipt: str = "{key}"


class AppliedWhen(_Strict):
    field: str
    values: list[Any] = Field(alias="in")


class LookupHow(_Strict):
    path: str = Field(pattern=r"^/")
    found: list[int] = [200]
    not_found: list[int] = [404]
    applied_when: AppliedWhen | None = None  # a field of the answer that says "applied"
    # What identifies *this* operation's effect in the answer: a field path of the JSON answer
    # ("response.customer_id") and the template it must equal ("{target}"). A lookup settles
    # `succeeded` only when every one matches (R14.3): never on a look-alike, never on a
    # record of another key a misrouted or hostile answer carries.
    identifies: dict[str, str] = Field(min_length=1)
    receipt: str = "{key}"


class ResolveHow(_Strict):
    path: str = Field(pattern=r"^/")
    not_found: list[int] = [404, 403]
    revision_field: str | None = None  # else the ETag header


class Statuses(_Strict):
    applied: list[int] = [200, 201]
    precondition_failed: list[int] = [412, 428]
    not_sent: list[int] = [429]
    # 409 under an idempotency key is "a request with this key is still being processed" in
    # the IETF Idempotency-Key draft: the original may yet apply, so it is no refusal. An API
    # whose 409 means a definitive refusal declares an in_doubt list without it.
    in_doubt: list[int] = [408, 409, 425]


class FenceAdvance(_Strict):
    """How to advance the API's fence for a key without writing (issue 37): a request with
    the generation in the fencing token header; a 2xx means advanced."""

    method: Literal["PUT", "POST"] = "PUT"
    path: str = Field(pattern=r"^/")
    # A field of the JSON answer holding the highest generation the API has now seen (it must
    # be at least the one asked for); None: a 2xx alone confirms.
    token_field: str | None = None


class Fencing(_Strict):
    token_header: str = "Fencing-Token"  # noqa: S105 - a header name, not a secret
    key_header: str = "Fencing-Key"
    refused_status: int = 409
    refused_code: str = "stale_fencing_token"
    advance: FenceAdvance


class Deadline(_Strict):
    """The API refuses, applying nothing, a request that arrives past the deadline it carries."""

    header: str = "Request-Deadline"
    refused_status: int = 408
    refused_code: str = "deadline_passed"


class ContractDecl(_Strict):
    idempotency: Literal["keyed", "replay_safe", "none"]
    lookup: bool = False
    retention_s: float | None = None
    call_timeout_s: float = Field(default=10.0, gt=0, le=60)


class Api(_Strict):
    name: str = Field(pattern=_NAME, max_length=32)
    base_url: str = Field(pattern=r"^https?://")
    contract_: ContractDecl = Field(alias="contract")
    actions: dict[str, Action] = Field(min_length=1)
    idempotency_header: str = "Idempotency-Key"
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    lookup: LookupHow | None = None
    resolve: ResolveHow | None = None
    statuses: Statuses = Statuses()
    fencing: Fencing | None = None
    deadline: Deadline | None = None

    @property
    def call_timeout_s(self) -> float:
        return self.contract_.call_timeout_s

    def contract(self) -> Contract:
        c = self.contract_
        return Contract(c.idempotency, lookup=c.lookup and self.lookup is not None,
                        retention=timedelta(seconds=c.retention_s) if c.retention_s else None,
                        call_timeout_s=c.call_timeout_s, fencing=self.fencing is not None,
                        deadline=self.deadline is not None)

    def auth(self, token: str) -> dict[str, str]:
        if not token:
            return {}
        return {self.auth_header: f"{self.auth_scheme} {token}".strip()}

    def url(self, path: str, values: Mapping[str, Any], *, quoted: bool = False) -> str:
        """``path`` with its placeholders filled, each value URL-quoted.

        Raises:
            ValueError: a filled segment is a dot segment (``.``, ``..``, in any encoding):
                the URL library would resolve it into another route (issue 38 §4).
        """
        filled = []
        for part in path.split("/"):
            done = _PLACE.sub(lambda m: str(_lookup(m, values)) if quoted
                              else quote(str(_lookup(m, values)), safe=""), part)
            if done != part and unquote(done) in (".", ".."):
                raise ValueError(f"a templated path segment is {unquote(done)!r}: it would "
                                 "name another route")
            filled.append(done)
        return "/".join(filled)


def parse(options: Mapping[str, Any]) -> Api:
    """The declaration in ``options``.

    Raises:
        ConfigurationError: what is wrong with it, field by field.
    """
    try:
        return Api.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise errors.ConfigurationError(f"HTTP connector declaration: {problems}",
                                        connector=options.get("name")) from exc


def _lookup(match: re.Match[str], values: Mapping[str, Any]) -> Any:
    found = values.get(match.group(1))
    for field in match.group(2).split(".")[1:]:  # {response.a.b}: nested fields
        found = found.get(field) if isinstance(found, Mapping) else None
    return "" if found is None else found


def render(template: str, values: Mapping[str, Any]) -> str:
    """A receipt (or any text) from its template."""
    return _PLACE.sub(lambda m: str(_lookup(m, values)), template)


def fill(body: Any, values: Mapping[str, Any]) -> Any:
    """A JSON body template with ``"$name"`` / ``"$name.field"`` strings replaced by values."""
    if isinstance(body, dict):
        return {k: fill(v, values) for k, v in body.items()}
    if isinstance(body, list):
        return [fill(v, values) for v in body]
    if isinstance(body, str) and body.startswith("$"):
        name, _, field = body[1:].partition(".")
        found = values.get(name)
        return found.get(field) if field and isinstance(found, Mapping) else found
    return body


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None when it is anything else (never raises)."""
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def field(body: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted field path of a JSON answer (``response.customer_id``)."""
    found: Any = body
    for name in path.split("."):
        found = found.get(name) if isinstance(found, Mapping) else None
    return found
