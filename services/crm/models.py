"""Request and response bodies of the CRM API: closed (``extra="forbid"``), bounded lengths.

No ``from __future__ import annotations``: FastAPI and pydantic read these at runtime.
"""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    StringConstraints,
    model_validator,
)

CLOSED = ConfigDict(extra="forbid", strict=True)

# Ids travel in paths and headers: a conservative alphabet keeps them out of log injection.
TenantId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,64}$")]
CustomerId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,64}$")]
DisplayName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Email = Annotated[str, StringConstraints(pattern=r"^[^@\s]{1,64}@[^@\s]{1,189}$")]
Phone = Annotated[str, StringConstraints(pattern=r"^\+?[0-9 ().-]{3,40}$")]
AddressLine = Annotated[str, StringConstraints(max_length=200)]
City = Annotated[str, StringConstraints(max_length=100)]
PostalCode = Annotated[str, StringConstraints(max_length=20)]
Country = Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]


class Scope(StrEnum):
    READ = "read"
    WRITE = "write"
    LOOKUP = "lookup"


class FenceState(BaseModel):
    """A key's fence: the highest fencing token seen for it."""

    fencing_key: str
    token: int


class Contact(BaseModel):
    """The contact fields of a customer; what a contact update may change."""

    model_config = CLOSED

    display_name: DisplayName
    email: Email | None = None
    phone: Phone | None = None
    address_line1: AddressLine | None = None
    address_line2: AddressLine | None = None
    city: City | None = None
    postal_code: PostalCode | None = None
    country: Country | None = None


class ContactUpdate(BaseModel):
    """A partial contact change: fields sent are set (``null`` clears), others are kept."""

    model_config = CLOSED

    display_name: DisplayName | None = None
    email: Email | None = None
    phone: Phone | None = None
    address_line1: AddressLine | None = None
    address_line2: AddressLine | None = None
    city: City | None = None
    postal_code: PostalCode | None = None
    country: Country | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("a contact update must set at least one field")
        if "display_name" in self.model_fields_set and self.display_name is None:
            raise ValueError("display_name cannot be cleared")
        return self


class Customer(Contact):
    # A response built from a database row: extra columns (tenant_id, created_at) are dropped.
    model_config = ConfigDict(extra="ignore", strict=False)

    customer_id: CustomerId
    revision: int
    updated_at: datetime


class Revisions(BaseModel):
    """``GET /v1/customers?id=…``: the current revision of each id found in the tenant."""

    revisions: dict[str, int]


class NoteCreate(BaseModel):
    model_config = CLOSED

    body: Annotated[str, StringConstraints(min_length=1, max_length=4000)]


class Note(BaseModel):
    note_id: UUID
    customer_id: CustomerId
    body: str
    created_at: datetime


class RefundCreate(BaseModel):
    model_config = CLOSED

    customer_id: CustomerId
    invoice_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    # A billion cents bounds a typo, not a business rule.
    amount_cents: Annotated[int, Field(gt=0, le=1_000_000_000)]
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
    reason: Annotated[str, StringConstraints(min_length=1, max_length=500)]


class Refund(BaseModel):
    refund_id: UUID
    customer_id: CustomerId
    invoice_id: str
    amount_cents: int
    currency: str
    reason: str
    created_at: datetime


class Operation(BaseModel):
    """What the CRM recorded for an idempotency key: the original response, verbatim."""

    idempotency_key: str
    method: str
    path: str
    status: int
    created_at: datetime
    expires_at: datetime
    response: JsonValue


class TokenCreate(BaseModel):
    model_config = CLOSED

    # FastAPI validates decoded JSON in Python mode, where a strict enum wants an instance.
    scopes: Annotated[list[Annotated[Scope, Strict(False)]], Field(min_length=1, max_length=3)]
    label: Annotated[str, StringConstraints(max_length=100)] = ""


class TokenIssued(BaseModel):
    """The only time the token is visible: the CRM keeps just its hash."""

    token: str
    tenant_id: TenantId
    scopes: list[Scope]


class Effect(BaseModel):
    effect_id: int
    tenant_id: TenantId
    kind: str
    customer_id: CustomerId
    idempotency_key: str | None
    request_hash: str
    created_at: datetime
