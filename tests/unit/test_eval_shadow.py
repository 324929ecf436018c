"""ShadowPlanner without I/O: production is never affected by its candidate."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from uuid import UUID

from agentledger import identity
from agentledger.contracts import proposals, requests
from agentledger.evals import shadow, shadow_contract
from agentledger.planning import adapters, proposer, retrieval
from agentledger.policy import allowlist

RULES = allowlist.Allowlist.load()
PRIVATE, PUBLIC = identity.generate_keypair("EdDSA")
SIGNER = identity.EnvelopeSigner(PRIVATE, "k")
KEYS = identity.KeySet.from_pem({"k": PUBLIC})
TENANT = uuid.uuid4()


class Retriever:
    def __init__(self) -> None:
        self.reads = 0

    async def snapshot(self, tenant_id: UUID, resource_id: str) -> retrieval.Snapshot:
        self.reads += 1
        body = json.dumps({"customer_id": resource_id}).encode()
        item = retrieval.evidence_item("E1", f"crm:customers/{resource_id}", body, datetime.now(UTC))
        return retrieval.Snapshot(resource_id, True, "1", {}, (item,))


class Broken:
    name, model = "broken", "v0"

    async def plan(self, task: adapters.Task) -> adapters.Plan | adapters.Refusal:
        raise RuntimeError("endpoint exploded")


class Slow:
    name, model = "slow", None

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def plan(self, task: adapters.Task) -> adapters.Plan | adapters.Refusal:
        await self.gate.wait()
        return adapters.Refusal("no_action", "thought about it")


def request(goal: str = "add note: hello") -> requests.RequestV1:
    op, rid = uuid.uuid4(), uuid.uuid4()
    return requests.RequestV1(
        request_id=rid, tenant_id=TENANT, principal_id="user:alice", operation_id=op, goal=goal,
        resource="c-1", created_at=datetime.now(UTC),
        identity=SIGNER.sign(tenant_id=TENANT, principal_id="user:alice", operation_id=op, request_id=rid,
                             binding=identity.request_binding(goal=goal, resource="c-1")))


def planner(candidate: adapters.Adapter, recorded: list[shadow_contract.ShadowComparisonV1],
            **kwargs: object) -> tuple[shadow.ShadowPlanner, Retriever]:
    retriever = Retriever()
    primary = proposer.Proposer(retriever=retriever, adapter=adapters.RulesAdapter(), rules=RULES,
                                envelope_keys=KEYS)

    async def record(c: shadow_contract.ShadowComparisonV1) -> None:
        recorded.append(c)

    return shadow.ShadowPlanner(primary=primary, candidate=candidate, record=record, **kwargs), retriever  # type: ignore[arg-type]


async def test_a_failing_candidate_is_recorded_and_production_is_untouched() -> None:
    recorded: list[shadow_contract.ShadowComparisonV1] = []
    shadowing, retriever = planner(Broken(), recorded)
    result = await shadowing.propose(request())
    assert isinstance(result, proposals.ProposalV1) and not result.shadow and result.planner.name == "rules"
    await shadowing.drain()
    [comparison] = recorded
    assert comparison.error == "the candidate failed: RuntimeError"
    assert comparison.proposal is None and comparison.same_action is False
    assert retriever.reads == 1


async def test_a_candidate_that_agrees_is_recorded_as_a_shadow_proposal_without_envelope() -> None:
    recorded: list[shadow_contract.ShadowComparisonV1] = []
    shadowing, _ = planner(adapters.RulesAdapter(), recorded)
    result = await shadowing.propose(request())
    await shadowing.drain()
    [comparison] = recorded
    assert comparison.proposal is not None and isinstance(result, proposals.ProposalV1)
    assert comparison.proposal.shadow and comparison.proposal.identity is None
    assert comparison.proposal.proposal_id != result.proposal_id
    assert comparison.proposal.operation_id == result.operation_id
    assert (comparison.same_action, comparison.same_arguments) == (True, True)


async def test_a_slow_candidate_never_holds_production_and_is_bounded() -> None:
    recorded: list[shadow_contract.ShadowComparisonV1] = []
    slow = Slow()
    shadowing, _ = planner(slow, recorded, max_in_flight=2)
    results = [await shadowing.propose(request(f"add note: n{i}")) for i in range(5)]
    assert all(isinstance(r, proposals.ProposalV1) for r in results)  # production answered at once
    assert shadowing.skipped == 3 and recorded == []
    slow.gate.set()
    await shadowing.drain()
    assert [c.candidate.refusal for c in recorded] == ["no_action", "no_action"]
