"""Policy decisions as admission records them: an id, an effect and the policy version (R2.9)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal, Protocol
from uuid import UUID

from agentledger.policy import allowlist as allowlist_mod

Effect = Literal["allow", "require_approval", "deny"]


@dataclass(frozen=True)
class Decision:
    """One persisted policy decision."""

    effect: Effect
    policy_version: str
    reason: str
    decision_id: UUID = field(default_factory=uuid.uuid4)


class Policy(Protocol):
    """Decides per tenant, principal, action and resource."""

    @property
    def version(self) -> str: ...

    def decide(
        self, *, tenant_id: UUID, principal_id: str, action: allowlist_mod.ActionSpec,
        resource_id: str,
    ) -> Decision: ...


class AllowlistPolicy:
    """Permits exactly what the allowlist names, for every principal of every tenant.

    The narrowest policy that still admits anything: it adds no permission beyond the
    allowlist and is versioned by the allowlist's own hash. Per-principal rules and human
    approval are decided by the Cedar policy engine where it is configured.
    """

    def __init__(self, allowlist: allowlist_mod.Allowlist) -> None:
        self._version = f"allowlist/{allowlist.version}"

    @property
    def version(self) -> str:
        return self._version

    def decide(
        self, *, tenant_id: UUID, principal_id: str, action: allowlist_mod.ActionSpec,
        resource_id: str,
    ) -> Decision:
        return Decision("allow", self._version, f"{action.name} is on the allowlist")
