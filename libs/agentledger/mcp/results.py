"""What a tool call answers: what is known, and nothing more.

Every answer has a ``status`` and, once ingress accepted the call, its ``operation_id``;
``structuredContent`` carries the same fields as the text, for programs. Statuses:

=================== ======== =====================================================
status              isError  meaning
=================== ======== =====================================================
``succeeded``       false    the provider confirmed the effect: ``receipt``
``pending_approval`` false   a person must decide ``approval_id`` (``approval_url``)
``in_progress``     false    accepted; no outcome within the wait: ask the status tool
``unknown``         true     the answer was lost: it may or may not have happened;
                             reconciliation decides (never reported as success)
``rejected``        true     admission refused the proposal (``code``, ``reason``)
``conflict``        true     the idempotency key already names a different call
``refused``         true     refused before it was proposed (invalid input): nothing
                             was proposed
``unavailable``     true     ingress did not answer: it may or may not have been
                             received; retry the same call (same key)
``not_found``       true     the status tool knows no answer for that operation (yet)
``denied`` ...      true     the outcome states ``denied``, ``expired``,
                             ``review_required``, ``failed``, with their ``reason``
=================== ======== =====================================================

Pure: builds values from what the gateway client found.
"""

from __future__ import annotations

import json
import typing
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import mcp_types as types

from agentledger import client, errors
from agentledger.contracts import outcomes
from agentledger.mcp import directory, tools

Status = Literal[
    "succeeded", "pending_approval", "in_progress", "unknown", "rejected", "conflict",
    "refused", "unavailable", "not_found", "denied", "expired", "review_required", "failed",
    "run_opened",
]
NOT_ERRORS: Final = frozenset({"succeeded", "pending_approval", "in_progress", "run_opened"})
STATUSES: Final[tuple[str, ...]] = typing.get_args(Status)

# Every tool's `outputSchema`: the answer's `structuredContent`, one object whatever the
# status (a union on `status`; the fields a status carries are in the table above).
OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["status"],
    "additionalProperties": False,
    "properties": {
        "status": {"type": "string", "enum": list(STATUSES)},
        "operation_id": {"type": "string", "format": "uuid"},
        "idempotency_key": {"type": "string", "maxLength": 255},
        "receipt": {"type": "string"},
        "approval_id": {"type": "string", "format": "uuid"},
        "approval_url": {"type": "string", "format": "uri"},
        "code": {"type": "string"},
        "reason": {"type": "string"},
        "run": {"type": "string", "maxLength": 128},
        "violations": {"type": "array", "items": {
            "type": "object", "properties": {"path": {"type": "string"},
                                             "message": {"type": "string"}}}},
    },
}


@dataclass(frozen=True)
class Answer:
    """One tool call's answer; ``None`` fields are not known (and not shown)."""

    status: Status
    operation_id: uuid.UUID | None = None
    idempotency_key: str | None = None
    receipt: str | None = None
    approval_id: uuid.UUID | None = None
    approval_url: str | None = None
    code: str | None = None
    reason: str | None = None
    violations: Sequence[Mapping[str, str]] = field(default_factory=tuple)
    run: str | None = None

    @property
    def is_error(self) -> bool:
        return self.status not in NOT_ERRORS

    def structured(self) -> dict[str, Any]:
        """The ``structuredContent`` object: every known field, ids as strings."""
        found: dict[str, Any] = {"status": self.status}
        for name in ("operation_id", "idempotency_key", "receipt", "approval_id",
                     "approval_url", "code", "reason", "run"):
            value = getattr(self, name)
            if value is not None:
                found[name] = str(value)
        if self.violations:
            found["violations"] = [dict(v) for v in self.violations]
        return found

    def text(self) -> str:
        """One paragraph a model reads: the status, what it means, what to do next."""
        op = f"operation {self.operation_id}"
        ask = f"Ask {tools.STATUS_TOOL} with operation_id {self.operation_id} for news."
        if self.status == "run_opened":
            return (f"run_opened: pass run={self.run} as the `run` argument of each call that "
                    "is a step of this run; its steps share one budget.")
        if self.status == "succeeded":
            return f"succeeded: {op} took effect; receipt {self.receipt}."
        if self.status == "pending_approval":
            return (f"pending_approval: nothing has happened yet. A person must decide approval "
                    f"{self.approval_id} ({self.approval_url}) for {op}. {ask}")
        if self.status == "in_progress":
            return (f"in_progress: {op} was accepted; no outcome is known yet, so do not assume "
                    f"it happened or did not. {ask}")
        if self.status == "unknown":
            return (f"unknown: the answer about {op} was lost; it may or may not have happened. "
                    "Do not repeat it under a new key: reconciliation decides, and "
                    f"{tools.STATUS_TOOL} reports the result.")
        if self.status == "unavailable":
            return (f"unavailable: agentledger did not answer, so it is not known whether {op} "
                    "was received. Retry the same call with the same idempotency key: it "
                    "names the same operation and cannot act twice.")
        if self.status == "not_found":
            return (f"not_found: no answer about {op} has been seen (an id from another tenant, "
                    "or one still on its way).")
        where = f" ({op})" if self.operation_id else ""
        lines = [f"{self.status}{where}: {self.code or self.status}: {self.reason or ''}".rstrip()]
        lines += [f"  {v.get('path', '/')}: {v.get('message', '')}" for v in self.violations]
        if self.status == "refused":
            lines.append("Nothing was proposed.")
        return "\n".join(lines)

    def to_result(self) -> types.CallToolResult:
        """The MCP ``CallToolResult``."""
        structured = self.structured()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=self.text()),
                     types.TextContent(type="text", text=json.dumps(structured))],
            structured_content=structured, is_error=self.is_error)


def from_outcome(outcome: outcomes.Outcome, operation_id: uuid.UUID, key: str | None
                 ) -> Answer:
    """The answer for a recorded outcome."""
    if isinstance(outcome, outcomes.Succeeded):
        return Answer("succeeded", operation_id, key, receipt=outcome.receipt)
    if isinstance(outcome, outcomes.Unknown):
        return Answer("unknown", operation_id, key)
    return Answer(outcome.state, operation_id, key, code=outcome.state, reason=outcome.reason)


def from_resolution(found: client.Resolution, key: str | None, console_url: str) -> Answer:
    """The answer for what the gateway client found about a submission: refused, an
    outcome, a pending approval, or (admitted, no outcome yet) ``in_progress``."""
    answer = found.admission
    if answer is not None and found.refused:
        return Answer("conflict" if answer.status == "conflict" else "rejected",
                      found.operation_id, key, code=answer.reason_code, reason=answer.reason)
    if found.outcome is not None:
        return from_outcome(found.outcome, found.operation_id, key)
    if answer is not None and answer.status == "pending_approval":
        return pending(found.operation_id, key, answer.approval_id, console_url)
    return Answer("in_progress", found.operation_id, key)


def pending(operation_id: uuid.UUID, key: str | None, approval_id: uuid.UUID | None,
            console_url: str) -> Answer:
    """A call waiting for a person: the approval and where to decide it."""
    url = (f"{console_url.rstrip('/')}/approvals/{approval_id}" if approval_id is not None
           else None)
    return Answer("pending_approval", operation_id, key, approval_id=approval_id,
                  approval_url=url)


def from_error(error: errors.AgentLedgerError, operation_id: uuid.UUID | None,
               key: str | None) -> Answer:
    """The answer for an error raised before admission answered (by this server or ingress).

    A retryable error (ingress unreachable after the client's retries) is ``unavailable``:
    the call may or may not have been received.
    """
    if isinstance(error, errors.IdempotencyConflict):
        return Answer("conflict", operation_id, key, code=error.code, reason=error.message)
    if error.retryable:
        return Answer("unavailable", operation_id, key, code=error.code, reason=error.message)
    found = error.details.get("violations")
    violations = [v for v in found if isinstance(v, Mapping)] if isinstance(found, list) else []
    code = error.details.get("code")
    # Refused before admission: no operation was started, whatever its id would have been.
    return Answer("refused", None, key, code=code if isinstance(code, str) and code
                  else error.code, reason=error.message, violations=tuple(violations))


def from_known(known: directory.Known, operation_id: uuid.UUID, console_url: str) -> Answer:
    """The answer for what the ledger records of an operation (the status tool)."""
    if known.state is None:
        if known.approval_state == "pending":
            return pending(operation_id, None, known.approval_id, console_url)
        if known.approval_state == "denied":
            return Answer("denied", operation_id, code="denied", reason=known.reason)
        if known.approval_state == "expired":
            return Answer("expired", operation_id, code="expired", reason=known.reason)
        return Answer("in_progress", operation_id)
    if known.state == "succeeded":
        return Answer("succeeded", operation_id, receipt=known.receipt)
    if known.state == "unknown":
        return Answer("unknown", operation_id)
    for ended in ("denied", "expired", "review_required", "failed"):
        if known.state == ended:
            return Answer(ended, operation_id, code=ended, reason=known.reason)
    return Answer("in_progress", operation_id)
