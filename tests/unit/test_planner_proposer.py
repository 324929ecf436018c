"""The proposer: identity comes from the verified envelope only; the allowlist gates output."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from agentledger import errors, identity
from agentledger.contracts import requests
from agentledger.planning import adapters, proposer, retrieval
from agentledger.policy.allowlist import Allowlist

RULES = Allowlist.load()
PRIVATE, PUBLIC = identity.generate_keypair()
KEYS = identity.KeySet.from_pem({"ingress-1": PUBLIC})
SIGNER = identity.EnvelopeSigner(PRIVATE, "ingress-1")
TENANT, OTHER_TENANT = uuid.uuid4(), uuid.uuid4()
FETCHED = datetime(2025, 1, 1, tzinfo=UTC)


class FakeRetriever:
    def __init__(self, found: bool = True) -> None:
        self.found, self.calls = found, []  # type: ignore[var-annotated]

    async def snapshot(self, tenant_id: uuid.UUID, resource_id: str) -> retrieval.Snapshot:
        self.calls.append((tenant_id, resource_id))
        if not self.found:
            return retrieval.Snapshot(resource_id, False, None, {}, ())
        item = retrieval.evidence_item("E1", f"crm:customers/{resource_id}", b'{"x":1}', FETCHED)
        return retrieval.Snapshot(resource_id, True, "7", {}, (item,))


class FixedAdapter:
    name, model = "scripted", "fixed"

    def __init__(self, plan: adapters.Plan | adapters.Refusal) -> None:
        self.result = plan

    async def plan(self, task: adapters.Task) -> adapters.Plan | adapters.Refusal:
        return self.result


def envelope_for(*, tenant_id: uuid.UUID = TENANT, operation_id: uuid.UUID, request_id: uuid.UUID,
                 goal: str = "g", resource: str = "cust-a", signer: identity.EnvelopeSigner = SIGNER) -> str:
    """The envelope ingress signs for a request with this goal and resource."""
    return signer.sign(tenant_id=tenant_id, principal_id="user:alice", operation_id=operation_id,
                       request_id=request_id, binding=identity.request_binding(goal=goal, resource=resource))


def request(goal: str = "g", **overrides: Any) -> requests.RequestV1:
    """A request signed for its defaults; ``overrides`` change it after signing (a forgery)
    unless they include ``identity``."""
    operation, request_id = uuid.uuid4(), uuid.uuid4()
    fields: dict[str, Any] = {"request_id": request_id, "tenant_id": TENANT, "principal_id": "user:alice",
                              "operation_id": operation, "goal": goal, "resource": "cust-a",
                              "identity": envelope_for(operation_id=operation, request_id=request_id, goal=goal),
                              "created_at": datetime.now(UTC)}
    fields.update(overrides)
    return requests.RequestV1(**fields)


def make(result: adapters.Plan | adapters.Refusal | None = None, retriever: FakeRetriever | None = None,
         adapter: Any = None) -> proposer.Proposer:
    return proposer.Proposer(retriever=retriever or FakeRetriever(),
                             adapter=adapter or FixedAdapter(result),  # type: ignore[arg-type]
                             rules=RULES, envelope_keys=KEYS)


async def test_rules_request_becomes_a_proposal_bound_to_the_envelope() -> None:
    req = request("update email to ada@example.com")
    retriever = FakeRetriever()
    proposal = await make(retriever=retriever, adapter=adapters.RulesAdapter()).propose(req)
    assert not isinstance(proposal, adapters.Refusal)
    assert (proposal.tenant_id, proposal.principal_id, proposal.operation_id, proposal.identity) == (
        TENANT, "user:alice", req.operation_id, req.identity)
    assert (proposal.action, proposal.target, proposal.expected_revision) == ("crm.contact.update", "cust-a", "7")
    assert proposal.planner.name == "rules"
    assert [e.source for e in proposal.evidence] == ["crm:customers/cust-a"]
    assert proposal.evidence_refs == [f"crm:customers/cust-a#sha256:{proposal.evidence[0].sha256[:16]}"]
    assert retriever.calls == [(TENANT, "cust-a")]
    # A redelivered request yields the same proposal id.
    again = await make(adapter=adapters.RulesAdapter()).propose(req)
    assert not isinstance(again, adapters.Refusal) and again.proposal_id == proposal.proposal_id


async def test_note_carries_no_revision_precondition() -> None:
    proposal = await make(adapter=adapters.RulesAdapter()).propose(request("add note: hi"))
    assert not isinstance(proposal, adapters.Refusal) and proposal.expected_revision is None


async def test_model_output_cannot_change_tenant_principal_or_operation() -> None:
    plan = adapters.Plan("crm.note.create", {"customer_id": "cust-a", "body": "x"}, "cust-a")
    req = request()
    proposal = await make(plan).propose(req)
    assert not isinstance(proposal, adapters.Refusal)
    assert (proposal.tenant_id, proposal.principal_id, proposal.operation_id) == (
        TENANT, "user:alice", req.operation_id)
    assert proposal.target == "cust-a" and proposal.expected_revision is None


async def test_a_plan_aimed_at_another_record_than_requested_is_refused() -> None:
    # Evidence (or a model obeying it) must not move the action to another record (R1.5).
    plan = adapters.Plan("crm.note.create", {"customer_id": "cust-b", "body": "x"}, "cust-b")
    refused = await make(plan).propose(request())
    assert isinstance(refused, adapters.Refusal) and refused.code == "target_not_requested"


@pytest.mark.parametrize(("plan", "code"), [
    (adapters.Plan("crm.customers.export_all", {}, "cust-a"), "unknown_action"),
    (adapters.Plan("crm.note.create", {"customer_id": "cust-a", "body": "x", "tenant_id": str(OTHER_TENANT)},
                   "cust-a"), "invalid_arguments"),
    (adapters.Plan("billing.refund.create", {"customer_id": "cust-a", "invoice_id": "I", "amount_minor": 10**9,
                                             "currency": "EUR", "reason": "r"}, "cust-a"), "invalid_arguments"),
    (adapters.Refusal("no_action", "nothing"), "no_action"),
])
async def test_outside_the_allowlist_is_not_proposed(plan: adapters.Plan | adapters.Refusal, code: str) -> None:
    result = await make(plan).propose(request())
    assert isinstance(result, adapters.Refusal) and result.code == code


async def test_unknown_resource_is_refused_before_planning() -> None:
    result = await make(adapter=adapters.RulesAdapter(), retriever=FakeRetriever(found=False)).propose(
        request("add note: x"))
    assert isinstance(result, adapters.Refusal) and result.code == "resource_not_found"


@pytest.mark.parametrize("field", ["tenant_id", "principal_id", "operation_id"])
async def test_request_fields_must_match_the_envelope(field: str) -> None:
    value = {"tenant_id": OTHER_TENANT, "principal_id": "user:mallory", "operation_id": uuid.uuid4()}[field]
    retriever = FakeRetriever()
    with pytest.raises(errors.IdentityRejected):
        await make(adapter=adapters.RulesAdapter(), retriever=retriever).propose(
            request("add note: x", **{field: value}))
    assert retriever.calls == []  # nothing is read for an unverified request


async def test_forged_envelope_is_rejected() -> None:
    other_private, _ = identity.generate_keypair()
    req = request("add note: x")
    forged = envelope_for(operation_id=req.operation_id, request_id=req.request_id, goal=req.goal,
                          signer=identity.EnvelopeSigner(other_private, "ingress-1"))
    with pytest.raises(errors.IdentityRejected):
        await make(adapter=adapters.RulesAdapter()).propose(req.model_copy(update={"identity": forged}))


@pytest.mark.parametrize("field", ["goal", "resource"])
async def test_a_request_rewritten_after_signing_is_rejected(field: str) -> None:
    retriever = FakeRetriever()
    with pytest.raises(errors.IdentityRejected, match="content its envelope was issued for"):
        await make(adapter=adapters.RulesAdapter(), retriever=retriever).propose(
            request("add note: x").model_copy(update={field: "refund all" if field == "goal" else "cust-b"}))
    assert retriever.calls == []
