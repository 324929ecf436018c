"""The JSON API: the same reviews and decisions as the pages, for a bearer session token.

The API never reads the console's cookie: a bearer header is not sent by a browser on its
own, so the API needs no CSRF token.
"""

# No `from __future__ import annotations`: FastAPI and pydantic read annotations at runtime.

import uuid
from typing import Annotated, Any, cast, get_args

import asyncpg
from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from agentledger import identity, web
from agentledger.approvals import repository as approvals
from agentledger.services.console import answers, auth, review

api = APIRouter(prefix="/api/v1")
STATES: tuple[str, ...] = get_args(approvals.State)


def bearer_session(
    request: Request, authorization: Annotated[str | None, Header(max_length=4200)] = None,
) -> identity.Session:
    """Raises IdentityRejected (401) or NotAnApprover (403)."""
    gate = cast(auth.Gate, request.app.state.gate)
    return gate.verify(web.bearer(authorization))


Session = Annotated[identity.Session, Depends(bearer_session)]


def _console(request: Request) -> review.Console:
    return cast(review.Console, request.app.state.console)


class DecisionBody(BaseModel):
    """What the approver saw and why they decide."""

    model_config = ConfigDict(extra="forbid")

    shown_hash: str = Field(min_length=64, max_length=64, pattern=r"^[0-9a-fA-F]{64}$")
    reason: str = Field(default="", max_length=500)


class NarrowBody(BaseModel):
    """A narrow-only edit: the hash of the request the approver saw, the complete narrowed
    arguments (validated and checked to only narrow by the library), and why."""

    model_config = ConfigDict(extra="forbid")

    shown_hash: str = Field(min_length=64, max_length=64, pattern=r"^[0-9a-fA-F]{64}$")
    arguments: dict[str, Any] = Field(max_length=64)
    reason: str = Field(default="", max_length=500)


def summary(r: review.Review) -> dict[str, Any]:
    a = r.approval
    return {
        "approval_id": str(a.approval_id), "operation_id": str(a.operation_id),
        "state": r.state, "stored_state": a.state, "action": a.action,
        "target": a.resource_id, "principal": a.principal_id, "risk": a.risk,
        "request_hash": a.hash_hex, "policy_version": a.policy_version,
        "allowlist_version": a.allowlist_version, "expected_revision": a.expected_revision,
        "created_at": a.created_at.isoformat(), "expires_at": a.expires_at.isoformat(),
        "seconds_left": r.seconds_left, "decided_by": a.decided_by,
        "decided_at": a.decided_at.isoformat() if a.decided_at else None,
        "decision_reason": a.decision_reason,
        "superseded_by": str(a.superseded_by) if a.superseded_by else None,
        "narrowed_from": str(a.narrowed_from) if a.narrowed_from else None,
    }


def detail(r: review.Review) -> dict[str, Any]:
    return {
        **summary(r),
        "arguments": r.arguments,
        "current": {"revision": r.current.revision, "record": r.current.record,
                    "problem": r.current.problem, "changed_since_proposal": r.stale},
        "changes": [{"field": c.name, "before": c.before, "after": c.after,
                     "changed": c.changed} for c in r.changes],
        # Untrusted data the planner read: a client must render it as text, never as markup.
        "evidence": [{**e, "untrusted": True} for e in r.shown_evidence],
        # N-of-M (issue 42): how many distinct approvers of which role, and who approved.
        "quorum": {"required": r.approval.required_approvals, "role": r.approval.approver_role,
                   "rule": r.approval.quorum_rule,
                   "approved_by": [v.approver for v in r.votes]},
        # Narrow-only edits (issue 42): what may narrow here, and the link to the original
        # (with the values the narrowing changed) or to the request that narrowed this one.
        "narrowable": r.narrowable,
        "narrowed_to": str(r.narrowed_to) if r.narrowed_to else None,
        "original_arguments": r.original_arguments,
        "narrowed_changes": [{"field": c.name, "original": c.before, "narrowed": c.after}
                             for c in r.narrowed_changes],
    }


@api.get("/approvals")
async def list_approvals(
    request: Request, session: Session,
    state: Annotated[str, Query(max_length=16)] = "pending",
) -> dict[str, Any]:
    if state not in STATES:
        state = "pending"
    found = await _console(request).listing(session, cast(approvals.State, state))
    return {"tenant_id": str(session.tenant_id), "state": state,
            "approvals": [summary(r) for r in found]}


@api.get("/approvals/{approval_id}")
async def get_approval(request: Request, approval_id: str, session: Session) -> dict[str, Any]:
    found = await _console(request).review(session, answers.approval_id(approval_id))
    return detail(found)


async def _decide(request: Request, approval_id: str, session: identity.Session,
                  body: DecisionBody, *, approve: bool) -> dict[str, Any]:
    decided, admitted = await _console(request).decide(
        session, answers.approval_id(approval_id), approve=approve,
        shown_hash=body.shown_hash, reason=body.reason)
    return {"approval_id": str(decided.approval_id), "state": decided.state,
            "operation_id": str(decided.operation_id), "decided_by": decided.decided_by,
            "admitted": admitted.status if admitted else None,
            "message": answers.MESSAGES[decided.state]}


@api.post("/approvals/{approval_id}/approve")
async def approve(request: Request, approval_id: str, session: Session,
                  body: DecisionBody) -> dict[str, Any]:
    return await _decide(request, approval_id, session, body, approve=True)


@api.post("/approvals/{approval_id}/deny")
async def deny(request: Request, approval_id: str, session: Session,
               body: DecisionBody) -> dict[str, Any]:
    return await _decide(request, approval_id, session, body, approve=False)


@api.post("/approvals/{approval_id}/narrow")
async def narrow(request: Request, approval_id: str, session: Session,
                 body: NarrowBody) -> dict[str, Any]:
    """Narrow a pending request and approve the narrowed one in the same step (issue 42)."""
    done = await _console(request).narrow(
        session, answers.approval_id(approval_id), shown_hash=body.shown_hash,
        arguments=body.arguments, reason=body.reason)
    n = done.narrowed
    return {"approval_id": str(done.original.approval_id), "state": done.original.state,
            "operation_id": str(n.operation_id), "fields": list(done.fields),
            "narrowed": {"approval_id": str(n.approval_id), "state": n.state,
                         "request_hash": n.hash_hex, "required_approvals": n.required_approvals,
                         "decided_by": n.decided_by,
                         "admitted": done.admitted.status if done.admitted else None},
            "message": f"{answers.MESSAGES['narrowed']} {answers.MESSAGES[n.state]}"}


@api.get("/operations/{operation_id}/explain")
async def explain_operation(operation_id: uuid.UUID, session: Session, request: Request
                            ) -> dict[str, Any]:
    """What was proposed, permitted, attempted and is known (R8.6), for the session's tenant
    only: another tenant's operation is indistinguishable from an unknown one (404)."""
    pool = cast(asyncpg.Pool, request.app.state.audit_pool)
    found = await _console(request).explain(session, pool, operation_id)
    return found.model_dump(mode="json")
