"""Admission's checks before the policy: they write nothing and decide nothing (R1.1 to R1.4, R9.2).

The identity envelope signed by ingress must verify and bind the proposal's tenant, principal
and operation id (R1.1); shadow runs are refused (R9.2); the action must be on the versioned
allowlist (R1.2) and its arguments satisfy the closed schema (R1.3); the target must resolve
inside the tenant at the expected revision (R1.4). Evaluation runs call these alone
(``Admitter.check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentledger import canonical, errors, identity
from agentledger.contracts.proposals import ProposalV1
from agentledger.policy import allowlist as allowlist_mod
from agentledger.resources import Resolver


@dataclass(frozen=True)
class Checked:
    """A proposal past the checks: its action, its validated arguments, the request its
    envelope names (the workflow of budgets; None without envelope keys)."""

    spec: allowlist_mod.ActionSpec
    arguments: dict[str, Any]
    workflow_id: str | None


@dataclass(frozen=True)
class Verified:
    """What the identity check established about a proposal."""

    # The request id the envelope names (the workflow of budgets); None when identity is
    # bound some other way (library use without envelope keys).
    workflow_id: str | None
    # A gateway's proposal: the request hash (R2.1) of its content as submitted, which the
    # envelope binds; None for a planner's proposal and without envelope keys.
    request_hash: bytes | None = None


def verify_identity(proposal: ProposalV1, envelope_keys: identity.KeySet | None) -> Verified:
    """The envelope must verify and bind tenant, principal and operation (R1.1)."""
    if envelope_keys is None:
        return Verified(None)
    if proposal.identity is None:
        raise errors.IdentityRejected("the proposal carries no identity envelope")
    found = identity.verify_envelope(proposal.identity, envelope_keys)
    identity.check_bound(found, tenant_id=proposal.tenant_id,
                         principal_id=proposal.principal_id,
                         operation_id=proposal.operation_id)
    if found.binding.kind == "proposal":
        # A gateway's proposal: exactly the content ingress accepted (issue 17 §6).
        try:
            bound = identity.proposal_binding(
                tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                action=proposal.action, target=proposal.target,
                arguments=proposal.arguments, expected_revision=proposal.expected_revision)
        except errors.ValidationFailed as exc:
            raise errors.IdentityRejected(
                "the proposal differs from the content its envelope was issued for") from exc
        identity.check_content(found, bound)
        return Verified(str(found.request_id), bytes.fromhex(bound.digest))
    if proposal.proposal_id != identity.planned_proposal_id(found.request_id):
        # A planner's proposal carries its request's envelope: the one proposal planned
        # from that request, whose content approvals bind to its id (``approvals.request``).
        raise errors.IdentityRejected(
            "the proposal is not the one planned from its envelope's request")
    return Verified(str(found.request_id))


async def check_proposal(
    proposal: ProposalV1, workflow_id: str | None, *, allowlist: allowlist_mod.Allowlist,
    resolver: Resolver,
) -> Checked:
    """Shadow refusal, allowlist, closed schema, target inside the tenant, revision.

    Raises:
        ShadowRefused, ValidationFailed (incl. UnknownAction, InvalidArguments,
        ResourceNotFound, StaleRevision); StorageError from the resolver.
    """
    if proposal.shadow:
        raise errors.ShadowRefused("shadow proposals are recorded, never admitted")
    spec = allowlist.get(proposal.action)
    arguments = spec.validate(proposal.arguments)
    spec.check_revision(proposal.expected_revision)
    named = arguments.get("customer_id")
    if named is not None and named != proposal.target:
        # The model must not aim at one record and write to another.
        raise errors.InvalidArguments(
            "arguments name a different customer than the proposal's target",
            violations=[{"path": "/arguments/customer_id", "message": "must equal target"}])
    resource = await resolver.resolve(proposal.tenant_id, spec.connector, proposal.target)
    if spec.requires_revision and resource.revision != proposal.expected_revision:
        raise errors.StaleRevision(
            "the target changed since it was read; plan again on the current record")
    return Checked(spec, arguments, workflow_id)


def request_hash(proposal: ProposalV1, checked: Checked, verified: Verified) -> bytes:
    """The command's request hash (R2.1): over its action, target, revision and validated
    arguments.

    For a gateway's proposal the identity check already computed it over the fields as
    submitted, and that is the same value: the spec is the one the proposal's action names and
    the validated arguments are a deep copy of the submitted ones (``ActionSpec.validate``:
    the same types, so the same canonical JSON; a ``1`` never becomes ``True``).

    Raises:
        errors.ValidationFailed: The arguments have no canonical JSON form.
    """
    if verified.request_hash is not None and checked.spec.name == proposal.action:
        return verified.request_hash
    return canonical.request_hash(
        tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
        action=checked.spec.name, target=proposal.target, arguments=checked.arguments,
        expected_revision=proposal.expected_revision)
