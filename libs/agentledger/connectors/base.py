"""What a connector declares and what a call can come back with.

A connector declares its idempotency contract (R6.7), which decides recovery (R5.5, R6.4):

- ``keyed``: the provider dedupes by an idempotency key within a retention window; with
  ``lookup`` it can also be asked what happened to a key. Resending the identical request
  with the same key is safe inside the window, so a lost answer is recovered.
- ``replay_safe``: repeating exactly the same request is harmless (a PUT of a full state).
- ``none``: nothing dedupes. A lost answer leaves the outcome ``unknown`` until an operator
  reconciles it; the request is never repeated.

It also declares the longest one call may take (``call_timeout_s``: the executor enforces it
and keeps the claim's lease covering it, so a worker that is not stalled never acts on an
expired claim) and whether the provider enforces fencing tokens (``fencing``): every call
carries its claim's generation, and such a provider refuses a write for a key under a
generation lower than one it has seen — the storage, not the worker, rejects a stale writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

Idempotency = Literal["keyed", "replay_safe", "none"]
Scope = Literal["read", "write", "lookup"]


@dataclass(frozen=True)
class Contract:
    """A connector's declared contract: idempotency, lookup, retention, call bound, fencing.

    ``call_timeout_s`` has no default: a connector that cannot say how long one call may
    take cannot have it covered by a lease.
    """

    idempotency: Idempotency
    lookup: bool = False
    retention: timedelta | None = None
    call_timeout_s: float = field(kw_only=True)
    fencing: bool = False

    def __post_init__(self) -> None:
        if not self.call_timeout_s > 0:
            raise ValueError("call_timeout_s must be positive")

    @property
    def may_resend(self) -> bool:
        """Whether the identical request may be sent again after a lost answer."""
        return self.idempotency in ("keyed", "replay_safe")


@dataclass(frozen=True)
class Call:
    """One command as the executor hands it to a connector: loaded from the ledger, decrypted."""

    tenant_id: UUID
    operation_id: UUID
    action: str
    resource_id: str
    arguments: Mapping[str, Any]
    expected_revision: str | None
    # The claim's fencing generation, sent to the provider with every write; None on a
    # reconciler's lookup, which writes nothing.
    fencing_generation: int | None = None

    @property
    def idempotency_key(self) -> str:
        """The stable operation id is the provider's idempotency key (R6.2); never regenerated.

        It is also the key a fencing provider fences on, idempotent or not.
        """
        return str(self.operation_id)


# ---- what a call returned -------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """The provider confirmed the effect; the receipt identifies it there."""

    receipt: str
    replayed: bool = False


@dataclass(frozen=True)
class PreconditionFailed:
    """The record changed since the command was approved (If-Match failed): nothing applied."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """The provider definitively refused (4xx other than a precondition): nothing applied."""

    reason: str
    status: int


@dataclass(frozen=True)
class Fenced:
    """The provider refused the call's fencing generation: a newer claim already wrote this
    key. Nothing applied, and the outcome is the newer claim's to record, not this one's."""

    reason: str


@dataclass(frozen=True)
class NotSent:
    """The request never reached the provider (e.g. connection refused): nothing applied."""

    reason: str


@dataclass(frozen=True)
class InDoubt:
    """No definitive answer (timeout, dropped connection, 5xx): the effect may have happened."""

    reason: str


@dataclass(frozen=True)
class NotFound:
    """A lookup found no trace of the key (within the provider's retention)."""

    reason: str = "the provider has no record of this idempotency key"


Result = Applied | PreconditionFailed | Refused | Fenced | NotSent | InDoubt
Lookup = Applied | NotFound | InDoubt


class Connector(Protocol):
    """A business system the executor may write to."""

    name: str
    actions: frozenset[str]
    contract: Contract
    scopes: frozenset[Scope]

    async def execute(self, call: Call, token: str) -> Result:
        """Perform the call with the write-scoped token, sending the idempotency key and the
        fencing generation."""
        ...

    async def lookup(self, call: Call, token: str) -> Lookup:
        """Ask the provider what happened to this call's key (contracts with ``lookup`` only)."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class Credentials:
    """Per connector, per tenant tokens of one scope. Loaded only where that scope belongs:
    write tokens in the executor, lookup tokens in the reconciler, read tokens in the planner
    and admission (R1.7).
    """

    scope: Scope
    tokens: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def token(self, connector: str, tenant_id: UUID) -> str | None:
        return self.tokens.get(connector, {}).get(str(tenant_id))
