"""HTTP bodies of ingress: closed (``extra="forbid"``), strict, bounded.

No ``from __future__ import annotations``: FastAPI and pydantic read these at runtime.
"""

from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from agentledger.contracts import common, proposals, requests

CLOSED = ConfigDict(extra="forbid", strict=True)


# The bodies are contracts too: text no column can store (U+0000, lone surrogates) is a 422
# here, never a failure later when the proposal built from it is validated.
class RequestBody(common.Contract):
    """A goal for the planner."""

    model_config = CLOSED

    goal: requests.Goal
    resource: common.ResourceId = Field(description="The resource hint: a CRM customer id.")


class ProposalBody(common.Contract):
    """A proposal from a gateway that planned itself (also the ``gateway.proposals.v1`` body)."""

    model_config = CLOSED

    action: common.ActionName
    arguments: common.Arguments
    target: common.ResourceId
    expected_revision: common.Revision | None = None
    evidence_refs: Annotated[list[proposals.EvidenceRef], Field(max_length=32)] = Field(
        default_factory=list)


class Accepted(BaseModel):
    """The 202 answer: the ids to follow the intent with."""

    operation_id: UUID
    tenant_id: UUID
    request_id: UUID | None = None
    proposal_id: UUID | None = None
    run_id: UUID | None = Field(default=None, description=(
        "The run the proposal is a step of (from AgentLedger-Run): the workflow id of the "
        "budgets its steps share."))
