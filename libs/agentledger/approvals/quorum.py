"""N-of-M approvals: which requests need several distinct approvers (issue 42, R16.2).

The operator's approval file (``AGENTLEDGER_APPROVALS``, format ``agentledger.approvals.v1``)
names **groups** (a role and its M members) and **rules**: an action, optionally an integer
argument above a threshold, the group whose role must approve, and N, how many distinct
members must. The first rule that matches decides; none matches: one approver, as before.

```json
{"format": "agentledger.approvals.v1",
 "groups": {"finance": {"role": "finance-approver",
                        "members": ["user:fiona", "user:frank", "user:fred"]}},
 "rules": [{"name": "large-refunds", "action": "billing.refund.create",
            "argument": "amount_minor", "above": 50000, "group": "finance", "required": 2}]}
```

``agentledger check-config`` names what cannot work: an unknown action or group, a role no
policy lets approve, N greater than M, a threshold on an argument that is not an integer.
The members are who the role is *expected* to hold; who may approve is still the principal
directory's roles and Cedar's answer at decision time (a member without the role is refused).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentledger import canonical, errors
from agentledger.notify import routing
from agentledger.policy import allowlist as allowlist_mod

FILE_FORMAT: Final = "agentledger.approvals.v1"
# v2 adds routing (channels, contacts, escalation: agentledger.notify.routing); v1 stays valid.
ROUTED_FORMAT: Final = "agentledger.approvals.v2"
# The ledger's CHECK on required_approvals.
MAX_REQUIRED: Final = 20

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]


class Group(BaseModel):
    """Who may be asked: a role and the principals expected to hold it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Annotated[str, Field(min_length=1, max_length=100)]
    members: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] = Field(
        min_length=1, max_length=200)
    # Routing (v2, agentledger.notify.routing): the channels a pending request reaches the
    # members through, and each member's addresses.
    channels: tuple[Name, ...] = Field(default=(), max_length=10)
    contacts: dict[Annotated[str, Field(min_length=1, max_length=200)], routing.Contact] = (
        Field(default_factory=dict, max_length=200))


class Rule(BaseModel):
    """An action (above a threshold) that needs ``required`` distinct approvers of a group."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    action: Annotated[str, Field(max_length=200)]
    argument: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")] | None = None
    above: int | None = None
    group: Name
    required: int = Field(ge=1, le=MAX_REQUIRED)
    # Escalation (v2): undecided after ``escalate_after``, the request is also routed to
    # ``escalate_to``, once (agentledger.notify.escalation).
    escalate_to: Name | None = None
    escalate_after: timedelta | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["agentledger.approvals.v1", "agentledger.approvals.v2"]
    groups: dict[Name, Group] = Field(default_factory=dict)
    rules: tuple[Rule, ...] = Field(default=(), max_length=200)
    channels: dict[Name, routing.Channel] = Field(default_factory=dict, max_length=20)


@dataclass(frozen=True, slots=True)
class Quorum:
    """What a request needs: ``required`` distinct approvers holding ``role``."""

    required: int
    role: str | None
    rule: str | None


ONE: Final = Quorum(1, None, None)


@dataclass(frozen=True)
class ApprovalRules:
    """A loaded approval file; empty (every request needs one approver) when none is set."""

    groups: Mapping[str, Group]
    rules: tuple[Rule, ...] = ()
    version: str = "none"
    channels: Mapping[str, routing.Channel] = field(default_factory=dict)
    format: str = FILE_FORMAT

    @classmethod
    def empty(cls) -> ApprovalRules:
        return cls({})

    @classmethod
    def load(cls, path: Path | str | None) -> ApprovalRules:
        """Read and validate an approval file (None: none).

        Raises:
            ValidationFailed: missing, not JSON, or not the format — naming where.
        """
        if path is None:
            return cls.empty()
        where = Path(path)
        try:
            document = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise errors.ValidationFailed(f"approvals {where}: cannot read JSON: {exc}") from exc
        return cls.parse(document)

    @classmethod
    def parse(cls, document: Any) -> ApprovalRules:
        try:
            parsed = _File.model_validate(document)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise errors.ValidationFailed(f"approvals: {at}: {first['msg']}") from exc
        version = "sha256:" + hashlib.sha256(canonical.canonical_bytes(document)).hexdigest()
        return cls(parsed.groups, parsed.rules, version, parsed.channels, parsed.format)

    def problems(self, rules: allowlist_mod.Allowlist, approving_roles: frozenset[str],
                 *, channels: bool = True) -> list[str]:
        """What cannot work with these actions and the roles the policies let approve
        (``channels``: also build each routing channel, as the notifier will — its options
        and signing secrets; without, only that its plugin is installed)."""
        found: list[str] = []
        for name, group in sorted(self.groups.items()):
            if group.role not in approving_roles:
                found.append(f"approval group {name}: unknown role {group.role!r} (the "
                             f"policies let {sorted(approving_roles)} approve)")
            if len(set(group.members)) != len(group.members):
                found.append(f"approval group {name}: a member is listed twice")
        names = [r.name for r in self.rules]
        for twice in sorted({n for n in names if names.count(n) > 1}):
            found.append(f"approval rule {twice}: declared twice")
        for rule in self.rules:
            where = f"approval rule {rule.name}"
            spec = rules.actions.get(rule.action)
            if spec is None:
                found.append(f"{where}: unknown action {rule.action!r}")
            asked = self.groups.get(rule.group)
            if asked is None:
                found.append(f"{where}: unknown group {rule.group!r}")
            elif rule.required > len(asked.members):
                found.append(f"{where}: needs {rule.required} approvers but group "
                             f"{rule.group} has {len(asked.members)}")
            if (rule.argument is None) != (rule.above is None):
                found.append(f"{where}: argument and above go together")
            elif rule.argument is not None and spec is not None:
                prop = spec.schema.get("properties", {}).get(rule.argument)
                if not isinstance(prop, Mapping) or prop.get("type") != "integer":
                    found.append(f"{where}: {rule.action}.{rule.argument} is not an integer "
                                 "argument")
        return found + routing.problems(self, build=channels)

    def quorum(self, action: str, arguments: Mapping[str, Any]) -> Quorum:
        """What a request of ``action`` with these (validated) arguments needs (pure)."""
        for rule in self.rules:
            if rule.action != action:
                continue
            if rule.argument is not None:
                value = arguments.get(rule.argument)
                if isinstance(value, bool) or not isinstance(value, int):
                    continue
                if rule.above is not None and value <= rule.above:
                    continue
            asked = self.groups.get(rule.group)
            if asked is None:
                continue  # unreachable where it matters: check-config and start refuse it
            return Quorum(rule.required, asked.role, rule.name)
        return ONE

    def rule(self, name: str | None) -> Rule | None:
        """The rule named ``name`` (None for none)."""
        return next((r for r in self.rules if r.name == name), None)

    def members(self, rule: str | None) -> tuple[str, ...]:
        """The members of the group a rule asks (empty for none)."""
        found = next((r for r in self.rules if r.name == rule), None)
        group = self.groups.get(found.group) if found else None
        return group.members if group else ()
