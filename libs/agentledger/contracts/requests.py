"""``agent.requests.v1``: a gateway's goal, accepted by ingress, for the planner.

The identity fields are copied from the verified session by ingress and bound by the signed
``identity`` envelope; the planner takes them from the envelope, never from the goal or
from a model (R1.1).
"""

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints

from agentledger.contracts import common

REQUEST_SCHEMA: Final = "agentledger.request.v1"
MAX_GOAL_CHARS: Final = 2000

Goal = Annotated[str, StringConstraints(min_length=1, max_length=MAX_GOAL_CHARS)]


class RequestV1(common.Contract):
    """A goal to plan, on behalf of a verified principal.

    Attributes:
        schema_: Always ``"agentledger.request.v1"`` (JSON field ``schema``).
        request_id: Identifies this message (and is bound in the envelope).
        operation_id: The durable intent id fixed by ingress (R3.1); the proposal keeps it.
        goal: What the gateway wants done, in its user's words; data, never authority.
        resource: The resource hint (a CRM customer id) the goal is about.
        identity: The identity envelope signed by ingress (``identity.verify_envelope``).
    """

    schema_: Literal["agentledger.request.v1"] = Field(default=REQUEST_SCHEMA, alias="schema")
    request_id: common.Uuid
    tenant_id: common.TenantId
    principal_id: common.PrincipalId
    operation_id: common.OperationId
    goal: Goal
    resource: common.ResourceId
    identity: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    created_at: common.Timestamp

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True,
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True,
    )
