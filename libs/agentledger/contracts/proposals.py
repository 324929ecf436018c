"""``agent.proposals.v1``: what a planner proposes, before admission checks anything.

A proposal is a request, never authority (R1.1, R1.5): admission validates the action and
its arguments against the allowlist, verifies ``identity``, and resolves the target inside
the tenant before anything is written.
"""

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator

from agentledger.contracts import common

PROPOSAL_SCHEMA: Final = "agentledger.proposal.v1"

EvidenceRef = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class PlannerInfo(common.Contract):
    """Which planner produced the proposal (for audit and model comparisons, R9)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    model: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None


# Enough of a note or record for a reviewer to judge it; the hash covers the full content.
MAX_EXCERPT_CHARS: Final = 1000


class EvidenceItem(common.Contract):
    """What the planner read, as a snapshot the approval console can show (R2.4).

    Attributes:
        ref: The id the planner and the model cite it by, e.g. ``E1``.
        source: Where it came from, e.g. ``crm:customers/c-1/notes/<id>``.
        sha256: Hex SHA-256 of the full content as fetched.
        fetched_at: When it was read.
        excerpt: The start of the content, bounded; untrusted data, never instructions.
        truncated: Whether ``excerpt`` is shorter than the content.
    """

    ref: Annotated[str, StringConstraints(min_length=1, max_length=16, pattern=r"^E[0-9]+$")]
    source: EvidenceRef
    sha256: common.HashHex
    fetched_at: common.Timestamp
    excerpt: Annotated[str, StringConstraints(max_length=MAX_EXCERPT_CHARS)]
    truncated: bool = False


class TokenUsage(common.Contract):
    """Model tokens a plan cost (R7.4); zero for the rules planner."""

    prompt_tokens: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    completion_tokens: Annotated[int, Field(ge=0, le=10_000_000)] = 0


class ProposalV1(common.Contract):
    """A planner's proposal of one action on one target.

    Attributes:
        schema_: Always ``"agentledger.proposal.v1"`` (JSON field ``schema``).
        proposal_id: Identifies this message; distinct from the business operation.
        operation_id: The durable intent id (R3.1); retries of one intent reuse it.
        arguments: The proposed arguments; checked against the action's closed schema by
            the allowlist, only bounded here.
        evidence_refs: References to what the planner read; data, never authority.
        shadow: A shadow run (R9.2): admitted for evaluation, never dispatched.
        identity: The signed identity envelope from ingress; verified by admission.
        evidence: The evidence snapshot the plan was made from (optional).
        usage: The model tokens the plan cost (optional).
    """

    # Not the deprecated BaseModel.schema(); the alias keeps the wire name "schema".
    schema_: Literal["agentledger.proposal.v1"] = Field(default=PROPOSAL_SCHEMA, alias="schema")
    proposal_id: common.Uuid
    tenant_id: common.TenantId
    principal_id: common.PrincipalId
    operation_id: common.OperationId
    action: common.ActionName
    arguments: common.Arguments
    target: common.ResourceId
    expected_revision: common.Revision | None = None
    evidence_refs: Annotated[list[EvidenceRef], Field(max_length=32)] = Field(
        default_factory=list
    )
    planner: PlannerInfo
    shadow: bool = False
    identity: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    created_at: common.Timestamp
    evidence: Annotated[list[EvidenceItem], Field(max_length=32)] = Field(default_factory=list)
    usage: TokenUsage | None = None

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True,
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True,
    )

    @field_validator("arguments")
    @classmethod
    def _bounded_arguments(cls, value: dict[str, object]) -> dict[str, object]:
        common.check_json_size(value)
        return value
