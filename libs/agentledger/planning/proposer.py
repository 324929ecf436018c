"""From a verified request to at most one proposal: retrieve, plan, check, bind identity.

Tenant, principal, operation id and the identity envelope are taken from the request's
verified envelope, never from a model's output (R1.1); an action outside the allowlist or
arguments outside its closed schema are not even proposed (admission checks again anyway).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from uuid import UUID

import pydantic
from opentelemetry import trace

from agentledger import errors, identity
from agentledger.contracts import proposals, requests
from agentledger.planning import adapters, budget, retrieval
from agentledger.policy import allowlist as allowlist_mod

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentledger.planning")

class Retriever(Protocol):
    async def snapshot(self, tenant_id: UUID, resource_id: str) -> retrieval.Snapshot:
        """Evidence for one resource inside one tenant."""
        ...


@dataclass(frozen=True)
class Proposer:
    """Plans requests into proposals.

    Attributes:
        retriever: Reads evidence with a READ-only scope.
        adapter: The planner adapter.
        rules: The allowlist proposals are checked against before publishing.
        envelope_keys: Ingress' public keys, to verify each request's envelope.
    """

    retriever: Retriever
    adapter: adapters.Adapter
    rules: allowlist_mod.Allowlist
    envelope_keys: identity.KeySet
    # Model tokens reserved before each model call (None: unbudgeted, e.g. offline evals).
    tokens: budget.TokenBudget | None = None

    async def propose(self, request: requests.RequestV1, *, now: datetime | None = None
                      ) -> proposals.ProposalV1 | adapters.Refusal:
        """The proposal for ``request``, or why there is none.

        Raises:
            errors.IdentityRejected: The envelope is invalid or does not match the request.
            errors.StorageError: Retrieval or the model endpoint is unavailable (retryable).
        """
        who = identity.verify_envelope(request.identity, self.envelope_keys)
        identity.check_bound(who, tenant_id=request.tenant_id,
                             principal_id=request.principal_id,
                             operation_id=request.operation_id)
        # The goal and resource ingress accepted, not a rewrite (issue 17 §6).
        identity.check_content(who, identity.request_binding(goal=request.goal,
                                                             resource=request.resource))
        with tracer.start_as_current_span("planning") as span:
            span.set_attribute("agentledger.planner", self.adapter.name)
            result = await self._plan(request, who, now or datetime.now(UTC))
            if isinstance(result, adapters.Refusal):
                span.set_attribute("agentledger.refusal", result.code)
                log.info("event=plan_refused code=%s attempted_action=%s", result.code,
                         result.attempted_action)
            else:
                span.set_attribute("agentledger.action", result.action)
            return result

    async def _plan(self, request: requests.RequestV1, who: identity.Identity, now: datetime
                    ) -> proposals.ProposalV1 | adapters.Refusal:
        snapshot = await self.retriever.snapshot(who.tenant_id, request.resource)
        if not snapshot.found:
            return adapters.Refusal("resource_not_found", "the resource hint was not found")
        task = adapters.Task(request.goal, request.resource, snapshot)
        if self.tokens is not None and self.adapter.name != "rules":  # rules spend no tokens
            try:
                plan = await self.tokens.around(who.tenant_id, str(who.request_id),
                                                who.operation_id, lambda: self.adapter.plan(task))
            except errors.BudgetExhausted as exc:
                return adapters.Refusal("budget_exhausted", exc.message)
        else:
            plan = await self.adapter.plan(task)
        if isinstance(plan, adapters.Refusal):
            return plan
        if plan.target != request.resource:
            # The gateway asked about one record; evidence (or a model obeying it) must not
            # move the action to another (R1.5, found by the eval's injection cases).
            return adapters.Refusal("target_not_requested",
                                    "the plan targets another record than the request's",
                                    attempted_action=plan.action[:64], usage=plan.usage)
        try:
            spec = self.rules.get(plan.action)
            spec.validate(plan.arguments)
        except errors.UnknownAction:
            return adapters.Refusal("unknown_action", "the action is not allowlisted",
                                    attempted_action=plan.action[:64], usage=plan.usage)
        except errors.InvalidArguments as exc:
            return adapters.Refusal("invalid_arguments", exc.message,
                                    attempted_action=plan.action, usage=plan.usage)
        # The revision is what retrieval saw, never what a model claims (R2.7).
        revision = (snapshot.revision if spec.requires_revision
                    and plan.target == snapshot.resource_id else None)
        try:
            return proposals.ProposalV1(
                # One request yields at most one proposal; its id is derived so a redelivered
                # request re-publishes the same proposal id (and admission can bind it).
                proposal_id=identity.planned_proposal_id(request.request_id),
                tenant_id=who.tenant_id, principal_id=who.principal_id,
                operation_id=who.operation_id, action=plan.action, arguments=plan.arguments,
                target=plan.target, expected_revision=revision,
                evidence_refs=list(plan.evidence_refs[:32]), evidence=list(snapshot.items[:32]),
                planner=proposals.PlannerInfo(name=self.adapter.name, model=self.adapter.model),
                identity=request.identity, created_at=now, usage=plan.usage,
            )
        except pydantic.ValidationError:
            return adapters.Refusal("invalid_arguments", "the plan does not fit a proposal",
                                    attempted_action=plan.action, usage=plan.usage)
