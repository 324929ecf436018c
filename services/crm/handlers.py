"""HTTP routes of the CRM stand-in: parse, authorize, call ``store``, shape the reply.

Business API, ``Authorization: Bearer <tenant token>``; the token decides the tenant, and
another tenant's data answers exactly like missing data (404):

- ``GET   /v1/customers/{id}`` (read): the record, ``ETag: "<revision>"``.
- ``GET   /v1/customers?id=a&id=b`` (read): ``{"revisions": {id: revision}}`` for the ids
  found (up to 100; a missing or another tenant's id is simply absent) — one read for many
  targets (admission's R1.4 check of a batch of proposals).
- ``POST  /v1/customers/{id}/notes`` (write): 201. ``Idempotency-Key`` optional, ``If-Match``
  optional (412 if stale). A note does not change the revision.
- ``PATCH /v1/customers/{id}/contact`` (write): 200 + new ``ETag``. ``If-Match`` required
  (428 if missing, 412 if stale), ``Idempotency-Key`` optional. Bumps the revision.
- ``POST  /v1/refunds`` (write): 201. NOT idempotent: ``Idempotency-Key`` is ignored.
- ``GET   /v1/operations/{key}`` (lookup): what was recorded under a key; 404 if unknown,
  expired or another tenant's.
- ``PUT   /v1/fences/{key}`` (lookup or write): ``Fencing-Token: <n>`` required; raises the
  key's fence to at least ``n`` and answers ``{"fencing_key", "token"}`` with the highest
  token seen, applying nothing else. A take-over or an operator's resolution advances the
  fence this way before deciding without the provider, so a stalled writer's late request
  is refused (409 ``stale_fencing_token``). Allowed under the lookup scope: it can only
  refuse stale writers, never apply an effect.

Under an ``Idempotency-Key`` (scoped per tenant, kept ``idempotency_retention_seconds``) the
same request gets the original response byte for byte plus ``Idempotent-Replayed: true``;
a different request (route, If-Match or canonical body) gets 422.

Fencing: a write may carry ``Fencing-Token: <n>`` (a non-negative integer) for the key named
by ``Fencing-Key`` (on notes and contact updates, ``Idempotency-Key`` when absent). Per
(tenant, key) the CRM keeps the highest token seen; a write carrying a lower one is refused
with 409 ``stale_fencing_token`` in the same transaction, and nothing is applied or replayed.
Equal or higher is accepted. Without ``Fencing-Token`` a write is not fenced. On a refund,
``Fencing-Key`` only fences: refunds are still never deduplicated.

Deadlines: a write may carry ``Request-Deadline: <RFC 3339 instant>`` (the caller's own call
bound); one that arrives after it is refused with 408 ``deadline_passed``, nothing applied.

Errors are ``{"error": {"code", "message"}}``: 400 bad header, 401 no/unknown token, 403
missing scope, 404, 408 deadline passed, 409 stale fencing token, 412, 422 invalid body or
reused key, 428, 503 storage or injected fault.

No ``from __future__ import annotations``: FastAPI reads these signatures at runtime.
"""

import hashlib
import json
import logging
import re
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import rfc8785
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from agentledger.services.crm import errors, faults, models, store

log = logging.getLogger(__name__)

JSON = "application/json"
# URL-safe characters only, so every key can be looked up as one path segment (and logged).
KEY_PATTERN = r"^[A-Za-z0-9._:~-]{1,255}$"
_ENTITY_TAG = re.compile(r'(W/)?"([0-9]{1,9})"')

CustomerIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9._:-]{1,64}$")]
TenantIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9._:-]{1,64}$")]
KeyHeader = Annotated[str | None, Header(pattern=KEY_PATTERN)]
IfMatchHeader = Annotated[str | None, Header(max_length=512)]
# Fits the bigint it is stored as.
FencingTokenHeader = Annotated[str | None, Header(pattern=r"^[0-9]{1,18}$")]
AuthorizationHeader = Annotated[str | None, Header(max_length=512)]


async def get_store(request: Request) -> store.Store:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop (and
    # ~0.1 ms of CPU) on every request for a lookup that never blocks.
    return _store(request)


StoreDep = Annotated[store.Store, Depends(get_store)]


def _bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise errors.Unauthenticated()
    return token.strip()


def requires(scope: models.Scope) -> Any:
    """A dependency resolving the caller's tenant from its token, refusing a missing scope."""

    async def principal(crm: StoreDep, authorization: AuthorizationHeader = None
                        ) -> store.Principal:
        found = await crm.authenticate(_bearer(authorization))
        if found is None:
            raise errors.Unauthenticated()
        if scope not in found.scopes:
            raise errors.Forbidden(f"this operation needs the {scope.value!r} scope")
        return found

    return Depends(principal)


# The hot routes (a note, the revision reads) parse their request by hand: FastAPI's
# dependency and parameter machinery cost more CPU per request than the rest of the route
# (issue 20 §4). The checks and the 422 answers are the same as the declared parameters'.
_KEY = re.compile(KEY_PATTERN)
_FENCING_TOKEN = re.compile(r"^[0-9]{1,18}$")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def _invalid(*loc: str | int, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])


def _store(request: Request) -> store.Store:
    crm_store: store.Store = request.app.state.store
    return crm_store


def _header(request: Request, name: str, *, pattern: re.Pattern[str] | None = None,
            max_length: int | None = None) -> str | None:
    value = request.headers.get(name)
    if value is None:
        return None
    if max_length is not None and len(value) > max_length:
        raise _invalid("header", name,
                       message=f"String should have at most {max_length} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise _invalid("header", name,
                       message=f"String should match pattern '{pattern.pattern}'")
    return value


def _path_id(request: Request, name: str = "customer_id") -> str:
    value = str(request.path_params[name])
    if not _ID.fullmatch(value):
        raise _invalid("path", name, message=f"String should match pattern '{_ID.pattern}'")
    return value


async def _caller(crm: store.Store, request: Request, scope: models.Scope) -> store.Principal:
    """``requires(scope)``, by hand."""
    found = await crm.authenticate(_bearer(_header(request, "authorization", max_length=512)))
    if found is None:
        raise errors.Unauthenticated()
    if scope not in found.scopes:
        raise errors.Forbidden(f"this operation needs the {scope.value!r} scope")
    return found


Body = TypeVar("Body", bound=BaseModel)


async def _body(request: Request, model: type[Body]) -> Body:
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors(include_url=False)]) from None


def _hand_parsed(body: type[BaseModel] | None, *headers: str) -> dict[str, Any]:
    """The OpenAPI of a route that parses by hand (its path has ``{customer_id}``): what the
    declared parameters showed."""
    extra: dict[str, Any] = {"parameters": [
        {"name": "customer_id", "in": "path", "required": True,
         "schema": {"type": "string", "pattern": _ID.pattern}},
        *({"name": h, "in": "header", "required": False, "schema": {"type": "string"}}
          for h in headers)]}
    if body is not None:
        extra["requestBody"] = {"required": True, "content": {
            JSON: {"schema": body.model_json_schema()}}}
    return extra


Reader = Annotated[store.Principal, requires(models.Scope.READ)]
Writer = Annotated[store.Principal, requires(models.Scope.WRITE)]
LookupCaller = Annotated[store.Principal, requires(models.Scope.LOOKUP)]


async def _admin(request: Request, authorization: AuthorizationHeader = None) -> None:
    expected = request.app.state.settings.admin_token
    presented = _bearer(authorization)
    if expected is None or not secrets.compare_digest(
        presented.encode(), expected.get_secret_value().encode()
    ):
        raise errors.Unauthenticated()


@dataclass(frozen=True)
class Reply:
    """A response as recorded under an idempotency key and sent on the wire."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, status: int, model: BaseModel, **headers: str) -> "Reply":
        return cls(status, model.model_dump_json().encode(), {"content-type": JSON, **headers})

    def response(self, **extra: str) -> Response:
        return Response(self.body, self.status, headers={**self.headers, **extra})


def _replay(recorded: store.Recorded) -> Response:
    log.info("event=idempotent_replay key=%s", recorded.idempotency_key)
    return Reply(recorded.status, recorded.body, dict(recorded.headers)).response(
        **{"idempotent-replayed": "true"}
    )


def _expected_revisions(if_match: str | None) -> frozenset[int] | None:
    """The revisions an If-Match header accepts; weak tags never match (strong comparison)."""
    if if_match is None:
        return None
    revisions: set[int] = set()
    for tag in if_match.split(","):
        found = _ENTITY_TAG.fullmatch(tag.strip())
        if found is None:
            # "*" would skip the lost-update check this API exists to make.
            raise errors.InvalidHeader('If-Match must list entity tags such as "3"')
        if found.group(1) is None:
            revisions.add(int(found.group(2)))
    return frozenset(revisions)


def _fence(token: str | None, key: str | None) -> store.Fence | None:
    """The write's fence, if it carries a token; a token with no key to fence is refused."""
    if token is None:
        return None
    if key is None:
        raise errors.InvalidHeader("Fencing-Token needs a key to fence: send Fencing-Key")
    return store.Fence(key, int(token))


def _check_deadline(request: Request) -> None:
    """Refuse a write that arrives after the deadline it carries (``Request-Deadline``)."""
    value = _header(request, "request-deadline", max_length=64)
    if value is None:
        return
    try:
        deadline = datetime.fromisoformat(value)
    except ValueError:
        raise errors.InvalidHeader("Request-Deadline must be an RFC 3339 instant") from None
    if deadline.tzinfo is None:
        raise errors.InvalidHeader("Request-Deadline must carry its offset (Z or ±hh:mm)")
    if datetime.now(UTC) > deadline:
        raise errors.DeadlinePassed(f"the request's deadline {value} has passed")


def _check_revision(customer: models.Customer, expected: frozenset[int] | None) -> None:
    if expected is not None and customer.revision not in expected:
        raise errors.PreconditionFailed(f"the current revision is {customer.revision}")


def _etag(customer: models.Customer) -> str:
    return f'"{customer.revision}"'


def _request_hash(request: Request, expected: frozenset[int] | None, body: BaseModel) -> bytes:
    """What makes two requests under one key "the same": route, precondition, canonical body."""
    document = {
        "method": request.method,
        "path": request.url.path,
        "if_match": None if expected is None else sorted(expected),
        "body": body.model_dump(mode="json", exclude_unset=True),
    }
    return hashlib.sha256(rfc8785.dumps(document)).digest()


def _applied(kind: str, principal: store.Principal, customer_id: str, key: str | None) -> None:
    log.info("event=effect_applied kind=%s tenant=%s customer=%s key=%s",
             kind, principal.tenant_id, customer_id, key)


api = APIRouter()


MAX_REVISIONS = 100


@api.get("/v1/customers", response_model=models.Revisions, openapi_extra={"parameters": [
    {"name": "id", "in": "query", "required": True, "style": "form", "explode": True,
     "schema": {"type": "array", "minItems": 1, "maxItems": MAX_REVISIONS,
                "items": {"type": "string", "pattern": _ID.pattern}}}]})
async def customer_revisions(request: Request) -> Response:
    crm = _store(request)
    principal = await _caller(crm, request, models.Scope.READ)
    ids = request.query_params.getlist("id")
    if not 1 <= len(ids) <= MAX_REVISIONS:
        raise _invalid("query", "id", message=f"List should have 1 to {MAX_REVISIONS} items")
    for i, value in enumerate(ids):
        if not _ID.fullmatch(value):
            raise _invalid("query", "id", i,
                           message=f"String should match pattern '{_ID.pattern}'")
    found = await crm.customer_revisions(principal.tenant_id, sorted(set(ids)))
    return Reply.of(200, models.Revisions(revisions=found)).response()


@api.get("/v1/customers/{customer_id}", response_model=models.Customer,
         openapi_extra=_hand_parsed(None))
async def get_customer(request: Request) -> Response:
    crm = _store(request)
    principal = await _caller(crm, request, models.Scope.READ)
    customer = await crm.get_customer(principal.tenant_id, _path_id(request))
    return Reply.of(200, customer, etag=_etag(customer)).response()


@api.post("/v1/customers/{customer_id}/notes", status_code=201, response_model=models.Note,
          openapi_extra=_hand_parsed(models.NoteCreate, "idempotency-key", "if-match",
                                     "fencing-token", "fencing-key"))
async def create_note(request: Request) -> Response:
    # The hot write: parsed by hand (see ``_hand_parsed``) and one statement
    # (store.create_note), its response built before it runs.
    crm = _store(request)
    principal = await _caller(crm, request, models.Scope.WRITE)
    _check_deadline(request)
    customer_id = _path_id(request)
    idempotency_key = _header(request, "idempotency-key", pattern=_KEY)
    expected = _expected_revisions(_header(request, "if-match", max_length=512))
    fence = _fence(_header(request, "fencing-token", pattern=_FENCING_TOKEN),
                   _header(request, "fencing-key", pattern=_KEY) or idempotency_key)
    note = await _body(request, models.NoteCreate)
    created = models.Note(note_id=uuid.uuid4(), customer_id=customer_id, body=note.body,
                          created_at=datetime.now(UTC))
    reply = Reply.of(201, created)
    recorded = await crm.create_note(principal.tenant_id, store.NoteWrite(
        created, idempotency_key, _request_hash(request, expected, note), request.method,
        request.url.path, fence, expected, reply.status, reply.headers, reply.body),
        roll_back=faults.failing(request))
    if recorded is not None:
        return _replay(recorded)
    _applied("note.created", principal, customer_id, idempotency_key)
    return reply.response()


@api.patch("/v1/customers/{customer_id}/contact", response_model=models.Customer)
async def update_contact(
    customer_id: CustomerIdPath, update: models.ContactUpdate, request: Request,
    principal: Writer, crm: StoreDep,
    idempotency_key: KeyHeader = None, if_match: IfMatchHeader = None,
    fencing_token: FencingTokenHeader = None, fencing_key: KeyHeader = None,
) -> Response:
    _check_deadline(request)
    expected = _expected_revisions(if_match)
    if expected is None:
        raise errors.PreconditionRequired()
    async with crm.mutation(
        tenant_id=principal.tenant_id, key=idempotency_key, method=request.method,
        path=request.url.path, request_hash=_request_hash(request, expected, update),
        fence=_fence(fencing_token, fencing_key or idempotency_key),
    ) as tx:
        if tx.recorded is not None:
            return _replay(tx.recorded)
        current = await tx.lock_customer(customer_id)
        _check_revision(current, expected)
        merged = models.Contact.model_validate({
            **current.model_dump(include=set(models.Contact.model_fields)),
            **update.model_dump(exclude_unset=True),
        })
        updated = await tx.update_contact(customer_id, merged)
        reply = Reply.of(200, updated, etag=_etag(updated))
        await tx.record(kind="contact.updated", customer_id=customer_id, status=reply.status,
                        headers=reply.headers, body=reply.body)
        faults.before_commit(request)
    _applied("contact.updated", principal, customer_id, idempotency_key)
    return reply.response()


@api.post("/v1/refunds", status_code=201, response_model=models.Refund)
async def create_refund(
    refund: models.RefundCreate, request: Request, principal: Writer, crm: StoreDep,
    fencing_token: FencingTokenHeader = None, fencing_key: KeyHeader = None,
) -> Response:
    # Deliberately not idempotent: an Idempotency-Key header is not even read, and the
    # fencing key refuses a stale writer but never dedupes.
    _check_deadline(request)
    async with crm.mutation(
        tenant_id=principal.tenant_id, key=None, method=request.method,
        path=request.url.path, request_hash=_request_hash(request, None, refund),
        fence=_fence(fencing_token, fencing_key),
    ) as tx:
        await tx.lock_customer(refund.customer_id)
        reply = Reply.of(201, await tx.insert_refund(refund))
        await tx.record(kind="refund.created", customer_id=refund.customer_id,
                        status=reply.status, headers=reply.headers, body=reply.body)
        faults.before_commit(request)
    _applied("refund.created", principal, refund.customer_id, None)
    return reply.response()


@api.get("/v1/operations/{idempotency_key}", response_model=models.Operation)
async def get_operation(
    idempotency_key: Annotated[str, Path(pattern=KEY_PATTERN)],
    principal: LookupCaller, crm: StoreDep,
) -> models.Operation:
    recorded = await crm.get_operation(principal.tenant_id, idempotency_key)
    if recorded is None:
        raise errors.NotFound()
    return models.Operation(
        idempotency_key=recorded.idempotency_key, method=recorded.method, path=recorded.path,
        status=recorded.status, created_at=recorded.created_at,
        expires_at=recorded.expires_at, response=json.loads(recorded.body),
    )


@api.put("/v1/fences/{fencing_key}", response_model=models.FenceState)
async def advance_fence(
    fencing_key: Annotated[str, Path(pattern=KEY_PATTERN)], request: Request, crm: StoreDep,
    fencing_token: FencingTokenHeader = None,
) -> models.FenceState:
    principal = await crm.authenticate(_bearer(_header(request, "authorization",
                                                       max_length=512)))
    if principal is None:
        raise errors.Unauthenticated()
    if not {models.Scope.LOOKUP, models.Scope.WRITE} & set(principal.scopes):
        raise errors.Forbidden("advancing a fence needs the 'lookup' or 'write' scope")
    if fencing_token is None:
        raise errors.InvalidHeader("Fencing-Token is required: the generation to fence at")
    highest = await crm.advance_fence(principal.tenant_id,
                                      store.Fence(fencing_key, int(fencing_token)))
    log.info("event=fence_advanced tenant=%s key=%s token=%d", principal.tenant_id,
             fencing_key, highest)
    return models.FenceState(fencing_key=fencing_key, token=highest)


admin = APIRouter(prefix="/admin", dependencies=[Depends(_admin)])


@admin.put("/tenants/{tenant_id}/customers/{customer_id}", response_model=models.Customer)
async def seed_customer(
    tenant_id: TenantIdPath, customer_id: CustomerIdPath, contact: models.Contact,
    crm: StoreDep,
) -> Response:
    customer = await crm.upsert_customer(tenant_id, customer_id, contact)
    return Reply.of(200, customer, etag=_etag(customer)).response()


@admin.post("/tenants/{tenant_id}/tokens", status_code=201)
async def issue_token(
    tenant_id: TenantIdPath, spec: models.TokenCreate, crm: StoreDep
) -> models.TokenIssued:
    token = await crm.issue_token(tenant_id, spec.scopes, spec.label)
    log.info("event=token_issued tenant=%s scopes=%s", tenant_id,
             ",".join(sorted(s.value for s in spec.scopes)))
    return models.TokenIssued(token=token, tenant_id=tenant_id, scopes=spec.scopes)


@admin.get("/effects")
async def list_effects(
    tenant: Annotated[str, Query(pattern=r"^[A-Za-z0-9._:-]{1,64}$")], crm: StoreDep
) -> dict[str, list[models.Effect]]:
    return {"effects": await crm.list_effects(tenant)}


fault_admin = APIRouter(prefix="/admin/faults", dependencies=[Depends(_admin)])


def _faults(request: Request) -> faults.Faults:
    armed: faults.Faults = request.app.state.faults
    return armed


@fault_admin.post("", status_code=201)
async def add_fault(rule: faults.Rule, request: Request) -> dict[str, list[faults.Rule]]:
    _faults(request).add(rule)
    log.info("event=fault_armed action=%s", rule.action.value)
    return {"rules": _faults(request).armed()}


@fault_admin.get("")
async def list_faults(request: Request) -> dict[str, list[faults.Rule]]:
    return {"rules": _faults(request).armed()}


@fault_admin.delete("", status_code=204)
async def clear_faults(request: Request) -> Response:
    _faults(request).clear()
    return Response(status_code=204)
