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
A fencing connector also offers ``fence``: it advances the provider's fence for a key to a
newer generation without writing anything, so a take-over or an operator's resolution can
fence a stalled worker out *before* deciding without it (issue 37).

Every write also carries its attempt's deadline (``Call.deadline``, sent as
``Request-Deadline``); a provider that refuses a request arriving past it (``deadline``)
narrows the window in which a stalled worker's call can still land where fencing is not
offered.

Whatever a connector returns or raises is classified again at the one boundary between a
provider and the ledger (:mod:`agentledger.connectors.boundary`): the executor, the
reconciler and the conformance kit never call ``execute``, ``lookup`` or ``fence`` directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

Idempotency = Literal["keyed", "replay_safe", "none"]
Scope = Literal["read", "write", "lookup"]

# The header a write's deadline travels in (RFC 3339, UTC, milliseconds): a provider that
# honours it refuses, applying nothing, a request that reaches it later (issue 37 §2).
DEADLINE_HEADER = "Request-Deadline"


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
    # The provider refuses, applying nothing, a request that reaches it past the deadline it
    # carries (``DEADLINE_HEADER``): once every sent attempt's deadline has passed, no late
    # call can land, fenced or not.
    deadline: bool = False

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
    # reconciler's lookup, which writes nothing. On ``fence``: the generation to advance to.
    fencing_generation: int | None = None
    # When this attempt's call bound ends (the lease covers it): sent with every write as
    # ``DEADLINE_HEADER``; None on a lookup or a fence.
    deadline: datetime | None = None

    @property
    def idempotency_key(self) -> str:
        """The stable operation id is the provider's idempotency key (R6.2); never regenerated.

        It is also the key a fencing provider fences on, idempotent or not.
        """
        return str(self.operation_id)

    def deadline_header(self) -> dict[str, str]:
        """``{DEADLINE_HEADER: <RFC 3339 UTC>}`` for a write with a deadline, else ``{}``."""
        if self.deadline is None:
            return {}
        return {DEADLINE_HEADER: format_deadline(self.deadline)}


def format_deadline(at: datetime) -> str:
    """A deadline as it travels: RFC 3339 in UTC with milliseconds (``…T05:00:00.123Z``)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


@dataclass(frozen=True)
class Advanced:
    """The provider's fence for the key now stands at ``generation`` or higher: a write under
    a lower generation will be refused (``Fenced``)."""

    generation: int


Result = Applied | PreconditionFailed | Refused | Fenced | NotSent | InDoubt
Lookup = Applied | NotFound | InDoubt
# What ``fence`` returns: advanced, or why not (nothing is known to be fenced then).
FenceResult = Advanced | Refused | NotSent | InDoubt


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
        """Ask the provider what happened to this call's key (contracts with ``lookup`` only).

        A lookup settles ``succeeded`` only on evidence that identifies *this* operation's
        effect (its key, and what else the provider records of it), never a look-alike."""
        ...

    async def aclose(self) -> None: ...


class Fencer(Protocol):
    """What a connector whose contract declares ``fencing`` offers besides ``Connector``."""

    async def fence(self, call: Call, token: str) -> FenceResult:
        """Advance the provider's fence for ``call.idempotency_key`` to
        ``call.fencing_generation``, writing nothing else (the lookup-scoped token)."""
        ...


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
