"""``agentledger check-config``: an allowlist, a policy set and the deployment's connectors
checked together, before any service starts on them.

Loading already refuses an allowlist whose argument schemas are not closed and bounded, and a
policy set that does not parse or validate against its schema. Together they must also agree
with the connectors: every allowlisted action names a configured connector that declares it,
and every connector offers the resolver admission checks its targets with.
The report then says, per principal role the policies name, what each action would get: run
without a person (``allow``), only after approval (``require_approval``), or ``deny``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cedarpy

from agentledger import errors
from agentledger.approvals import quorum as quorum_mod
from agentledger.budgets import rules as budget_rules
from agentledger.connectors import plugins
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import repository as policy_repo

# The tenant of the synthetic principals the role table is computed for.
_TENANT = uuid.UUID(int=0)


@dataclass
class Report:
    """What was checked and what was found: ``problems`` empty means usable as configured."""

    allowlist_version: str | None = None
    policy_version: str | None = None
    actions: dict[str, str] = field(default_factory=dict)  # action → connector
    connectors: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → contract
    roles: dict[str, dict[str, str]] = field(default_factory=dict)  # role → action → effect
    budgets_version: str | None = None
    budgets: list[dict[str, Any]] = field(default_factory=list)
    approvals_version: str | None = None
    quorum_rules: list[dict[str, Any]] = field(default_factory=list)
    narrow_rules: dict[str, dict[str, str]] = field(default_factory=dict)  # action → field → how
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(allowlist_path: Path | None, policy_dir: Path | None,
          connector_options: Mapping[str, Mapping[str, Any]],
          budgets_path: Path | None = None, approvals_path: Path | None = None) -> Report:
    """Check the three together (and the operator's budgets against the allowlist); every
    problem is reported, not only the first."""
    report = Report()
    rules: allowlist_mod.Allowlist | None = None
    policy: cedar.CedarPolicy | None = None
    try:
        rules = allowlist_mod.Allowlist.load(allowlist_path)
        report.allowlist_version = rules.version
        report.actions = {name: spec.connector for name, spec in rules.actions.items()}
        report.narrow_rules = {name: dict(spec.narrowable)
                               for name, spec in sorted(rules.actions.items()) if spec.narrowable}
    except errors.ValidationFailed as exc:
        report.problems.append(f"allowlist: {exc.message}")
    try:
        policy = cedar.CedarPolicy(policy_dir)
        report.policy_version = policy.version
    except errors.ValidationFailed as exc:
        report.problems.append(f"policies: {exc.message}")
    declared: dict[str, frozenset[str]] = {}
    for name, options in connector_options.items():
        try:
            connector = plugins.make(name, options)
        except errors.ConfigurationError as exc:
            report.problems.append(f"connector {name}: {exc.message}")
            continue
        declared[name] = connector.actions
        try:  # admission checks every target through it (R1.4): without one it won't start
            plugins.factory(name, options, plugins.RESOLVERS)
        except errors.ConfigurationError as exc:
            report.problems.append(f"connector {name}: {exc.message}")
        c = connector.contract
        report.connectors[name] = {
            "actions": sorted(connector.actions), "idempotency": c.idempotency,
            "lookup": c.lookup, "fencing": c.fencing, "call_timeout_s": c.call_timeout_s,
            "retention_s": c.retention.total_seconds() if c.retention else None}
    if rules is not None:
        for action, spec in sorted(rules.actions.items()):
            if spec.connector not in connector_options:
                report.problems.append(f"action {action}: connector {spec.connector!r} is not "
                                       "configured")
            elif spec.connector in declared and action not in declared[spec.connector]:
                report.problems.append(f"action {action}: connector {spec.connector!r} does "
                                       f"not declare it (it declares "
                                       f"{sorted(declared[spec.connector])})")
        if policy is not None:
            report.roles = role_table(policy, rules, policy_dir)
    try:
        found = budget_rules.Budgets.load(budgets_path)
        report.budgets_version = found.version
        report.budgets = found.describe()
        if rules is not None:
            report.problems.extend(found.problems(rules))
    except errors.ValidationFailed as exc:
        report.problems.append(exc.message)
    try:
        approval_rules = quorum_mod.ApprovalRules.load(approvals_path)
        report.approvals_version = approval_rules.version
        report.quorum_rules = [r.model_dump(mode="json", exclude_none=True) | {
            "role": approval_rules.groups[r.group].role if r.group in approval_rules.groups
            else None, "members": list(approval_rules.members(r.name))}
            for r in approval_rules.rules]
        if rules is not None:
            report.problems.extend(approval_rules.problems(rules, policy_repo.APPROVING_ROLES))
    except errors.ValidationFailed as exc:
        report.problems.append(exc.message)
    return report


def load_approvals(approvals_path: Path | None, rules: allowlist_mod.Allowlist, *,
                   channels: bool = False) -> quorum_mod.ApprovalRules:
    """The operator's N-of-M approval rules for a service about to start on ``rules``
    (``channels``: the notifier, which sends — each channel built, secrets and all).

    Raises:
        ConfigurationError: naming every problem (as ``check-config`` does).
    """
    try:
        found = quorum_mod.ApprovalRules.load(approvals_path)
    except errors.ValidationFailed as exc:
        raise errors.ConfigurationError(exc.message) from exc
    problems = found.problems(rules, policy_repo.APPROVING_ROLES, channels=channels)
    if problems:
        raise errors.ConfigurationError("; ".join(problems))
    return found


def load_budgets(budgets_path: Path | None,
                 rules: allowlist_mod.Allowlist) -> budget_rules.Budgets:
    """The operator's budgets for a service about to start on ``rules``.

    Raises:
        ConfigurationError: the file does not load or does not fit the allowlist, naming
        every problem (the service refuses to start; ``check-config`` says the same).
    """
    try:
        found = budget_rules.Budgets.load(budgets_path)
    except errors.ValidationFailed as exc:
        raise errors.ConfigurationError(exc.message) from exc
    problems = found.problems(rules)
    if problems:
        raise errors.ConfigurationError("; ".join(problems))
    return found


def role_table(policy: cedar.CedarPolicy, rules: allowlist_mod.Allowlist,
               policy_dir: Path | None) -> dict[str, dict[str, str]]:
    """Per role named in the policies: each action's effect for a principal with that role
    alone, arguments empty (a rule on an argument, e.g. a refund's amount, is not applied)."""
    table: dict[str, dict[str, str]] = {}
    for role in sorted(roles_named(policy_dir)):
        principal = cedar.Principal(_TENANT, f"check:{role}", frozenset({role}))
        table[role] = {
            name: policy.evaluate(cedar.PolicyRequest(principal, spec, "any")).effect
            for name, spec in sorted(rules.actions.items())}
    return table


def roles_named(policy_dir: Path | None) -> set[str]:
    """The role names the policies test ``principal.roles`` against."""
    source = policy_dir or cedar.configured_dir()
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(source.glob("*.cedar")))
    return set(_role_literals(json.loads(cedarpy.policies_to_json_str(text))))


def _role_literals(node: object) -> Iterator[str]:
    # Cedar's JSON policy form (cedarpy.policies_to_json_str): a ``contains``/``containsAny``/
    # ``containsAll`` whose left side is ``<var>.roles`` names roles on its right side.
    if isinstance(node, dict):
        for op in ("contains", "containsAny", "containsAll"):
            found = node.get(op)
            if isinstance(found, dict) and _is_roles(found.get("left")):
                yield from _values(found.get("right"))
        for value in node.values():
            yield from _role_literals(value)
    elif isinstance(node, list):
        for value in node:
            yield from _role_literals(value)


def _is_roles(node: object) -> bool:
    return isinstance(node, dict) and isinstance(node.get("."), dict) and (
        node["."].get("attr") == "roles")


def _values(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("Value"), str):
            yield node["Value"]
        for item in node.get("Set", []) if isinstance(node.get("Set"), list) else []:
            yield from _values(item)
