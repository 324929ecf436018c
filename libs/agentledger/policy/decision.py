"""Policy decisions as admission records them: an id, an effect and the policy version (R2.9)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol
from uuid import UUID

from agentledger.policy import allowlist as allowlist_mod

if TYPE_CHECKING:
    from agentledger.ledger.repository import Conn
    from agentledger.policy.cedar import Principal

Effect = Literal["allow", "require_approval", "deny"]


@dataclass(frozen=True)
class Decision:
    """One persisted policy decision."""

    effect: Effect
    policy_version: str
    reason: str
    decision_id: UUID = field(default_factory=uuid.uuid4)


class Policy(Protocol):
    """Decides per tenant, principal, action and resource, from what it is given."""

    @property
    def version(self) -> str: ...

    def decide(
        self, *, tenant_id: UUID, principal_id: str, action: allowlist_mod.ActionSpec,
        resource_id: str,
    ) -> Decision: ...


class Authorizer(Protocol):
    """Asks the CURRENT policy about a principal as the database records it NOW.

    Admission asks before admitting; the executor asks again before every call, so a
    revocation recorded in between stops queued work (R2.6).
    """

    @property
    def version(self) -> str: ...

    async def authorize(
        self, conn: Conn, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None, in_transaction: bool = False,
    ) -> Decision:
        """``in_transaction``: ``conn`` is inside a transaction bound to ``tenant_id``; the
        principal is read there."""
        ...

    def authorize_known(
        self, found: Principal | None, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None,
    ) -> Decision:
        """``authorize`` with the principal as the caller's statement just read it (None:
        no such principal in the tenant)."""
        ...

    async def may_approve(
        self, conn: Conn, *, tenant_id: UUID, approver_id: str, requester_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None,
    ) -> Decision: ...
