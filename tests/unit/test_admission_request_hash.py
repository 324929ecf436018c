"""The request hash admission stores (R2.1) when the identity check already computed it.

A gateway's proposal is bound by its envelope to the request hash of its content as
submitted; admission reuses that digest for the command instead of computing it again over
the validated arguments. These tests hold the reuse to what it relies on: the validated
arguments are the submitted ones, type for type (``1`` never becomes ``True`` or ``1.0``), so
both hashes are the same; a planner's proposal (bound to its request) gets the hash computed."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from agentledger import canonical, errors, identity
from agentledger.admission import checks
from agentledger.contracts.proposals import ProposalV1
from agentledger.policy import allowlist

ALLOWLIST = allowlist.Allowlist.load()
PRIVATE, PUBLIC = identity.generate_keypair()
KEYS = identity.KeySet.from_pem({"ingress-1": PUBLIC})
SIGNER = identity.EnvelopeSigner(PRIVATE, "ingress-1", ttl_s=300)
TENANT = uuid.uuid4()

ARGUMENTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("crm.note.create", {"customer_id": "c-1", "body": "Called \u00e9 \U0001f600 about it."}, None),
    ("crm.contact.update", {"customer_id": "c-1", "changes": {"email": "ada@example.com"}}, "r-7"),
    ("billing.refund.create", {"customer_id": "c-1", "invoice_id": "inv_9", "amount_minor": 1,
                               "currency": "EUR", "reason": "Duplicate charge"}, None),
]


def _proposal(action: str, arguments: dict[str, Any], revision: str | None,
              binding: identity.Binding | None = None, **fields: Any) -> ProposalV1:
    operation_id, request_id = uuid.uuid4(), uuid.uuid4()
    if binding is None:
        binding = identity.proposal_binding(
            tenant_id=TENANT, principal_id="user:alice", action=action, target="c-1",
            arguments=arguments, expected_revision=revision)
    token = SIGNER.sign(tenant_id=TENANT, principal_id="user:alice", operation_id=operation_id,
                        request_id=request_id, roles=("agent",), now=time.time(),
                        binding=binding)
    return ProposalV1.model_validate({
        "proposal_id": str(fields.get("proposal_id", uuid.uuid4())), "tenant_id": str(TENANT),
        "principal_id": "user:alice", "operation_id": str(operation_id), "action": action,
        "arguments": arguments, "target": "c-1", "expected_revision": revision,
        "planner": {"name": "rules"}, "identity": token,
        "created_at": datetime.now(UTC).isoformat()})


def _computed(proposal: ProposalV1, checked: checks.Checked) -> bytes:
    return canonical.request_hash(
        tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
        action=checked.spec.name, target=proposal.target, arguments=checked.arguments,
        expected_revision=proposal.expected_revision)


@pytest.mark.parametrize(("action", "arguments", "revision"), ARGUMENTS)
def test_a_gateway_proposal_reuses_the_hash_its_envelope_binds(
        action: str, arguments: dict[str, Any], revision: str | None) -> None:
    proposal = _proposal(action, arguments, revision)
    verified = checks.verify_identity(proposal, KEYS)
    assert verified.request_hash is not None and verified.workflow_id is not None
    spec = ALLOWLIST.get(proposal.action)
    checked = checks.Checked(spec, spec.validate(proposal.arguments), verified.workflow_id)
    assert checks.request_hash(proposal, checked, verified) is verified.request_hash
    assert verified.request_hash == _computed(proposal, checked)


def test_validated_arguments_keep_every_type_so_the_hashes_agree() -> None:
    """What the reuse relies on: ``validate`` returns the submitted values unchanged, a copy."""
    spec = ALLOWLIST.get("billing.refund.create")
    submitted: dict[str, Any] = dict(ARGUMENTS[2][1])
    validated = spec.validate(submitted)
    assert validated == submitted and validated is not submitted
    assert [type(v) for v in validated.values()] == [type(v) for v in submitted.values()]
    assert canonical.canonical_bytes(validated) == canonical.canonical_bytes(submitted)


def test_a_planners_proposal_gets_its_hash_computed() -> None:
    action, arguments, _ = ARGUMENTS[0]
    request_id = uuid.uuid4()
    binding = identity.request_binding(goal="note it", resource="c-1")
    token = SIGNER.sign(tenant_id=TENANT, principal_id="user:alice", operation_id=uuid.uuid4(),
                        request_id=request_id, roles=("agent",), now=time.time(), binding=binding)
    claims = identity.verify_envelope(token, KEYS)
    proposal = ProposalV1.model_validate({
        "proposal_id": str(identity.planned_proposal_id(request_id)), "tenant_id": str(TENANT),
        "principal_id": "user:alice", "operation_id": str(claims.operation_id), "action": action,
        "arguments": arguments, "target": "c-1", "planner": {"name": "rules"},
        "identity": token, "created_at": datetime.now(UTC).isoformat()})
    verified = checks.verify_identity(proposal, KEYS)
    assert verified == checks.Verified(str(request_id), None)
    spec = ALLOWLIST.get(action)
    checked = checks.Checked(spec, spec.validate(proposal.arguments), verified.workflow_id)
    assert checks.request_hash(proposal, checked, verified) == _computed(proposal, checked)


def test_content_other_than_the_envelopes_is_refused_before_any_hash_is_reused() -> None:
    """Arguments equal in Python to the bound ones (``True == 1``) are other content."""
    action, arguments, revision = ARGUMENTS[2]
    bound = identity.proposal_binding(
        tenant_id=TENANT, principal_id="user:alice", action=action, target="c-1",
        arguments={**arguments, "amount_minor": True}, expected_revision=revision)
    with pytest.raises(errors.IdentityRejected, match="content its envelope was issued for"):
        checks.verify_identity(_proposal(action, arguments, revision, binding=bound), KEYS)


def test_without_envelope_keys_nothing_is_verified_and_the_hash_is_computed() -> None:
    action, arguments, revision = ARGUMENTS[1]
    proposal = _proposal(action, arguments, revision)
    verified = checks.verify_identity(proposal, None)
    assert verified == checks.Verified(None, None)
    spec = ALLOWLIST.get(action)
    checked = checks.Checked(spec, spec.validate(proposal.arguments), None)
    assert checks.request_hash(proposal, checked, verified) == _computed(proposal, checked)
