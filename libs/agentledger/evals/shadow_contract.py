"""``agent.shadow.v1``: what a shadow run records for comparison (R9.2).

One record per live request a candidate planned beside production: both plans summarised
side by side, and the candidate's proposal itself, marked ``shadow`` and stripped of the
identity envelope, so that even with its flag removed it could never be admitted.
"""

# No `from __future__ import annotations`: pydantic resolves these annotations at runtime.

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints

from agentledger.contracts import common, proposals

SHADOW_TOPIC: Final = "agent.shadow.v1"
SHADOW_SCHEMA: Final = "agentledger.shadow.v1"


class PlanSummary(common.Contract):
    """One planner's answer to a request, without its payload.

    Attributes:
        action, target: What it proposed; both ``None`` when it refused.
        arguments_sha256: SHA-256 of the RFC 8785 form of its arguments.
        refusal: The refusal code when it proposed nothing.
    """

    planner: proposals.PlannerInfo
    action: common.ActionName | None = None
    target: common.ResourceId | None = None
    arguments_sha256: common.HashHex | None = None
    refusal: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    tokens: Annotated[int, Field(ge=0, le=20_000_000)] = 0


class ShadowComparisonV1(common.Contract):
    """Production's plan and the candidate's, for one live request.

    Attributes:
        proposal: The candidate's proposal (``shadow=True``, no identity envelope), or
            ``None`` when it refused or failed.
        same_action: Both refused, or both proposed the same action on the same target.
        same_arguments: ``same_action`` and the same canonical arguments.
        error: Why the candidate produced nothing (e.g. its endpoint failed); the production
            plan was published regardless.
    """

    schema_: Literal["agentledger.shadow.v1"] = Field(default=SHADOW_SCHEMA, alias="schema")
    request_id: common.Uuid
    tenant_id: common.TenantId
    operation_id: common.OperationId
    production: PlanSummary
    candidate: PlanSummary
    proposal: proposals.ProposalV1 | None = None
    same_action: bool
    same_arguments: bool
    error: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    recorded_at: common.Timestamp

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True,
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True,
    )
