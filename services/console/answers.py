"""How the console answers a refused decision: one table for the pages and the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from uuid import UUID

from agentledger import errors, web


@dataclass(frozen=True)
class Answer:
    status: int
    code: str  # the page's message key and the API's error code
    message: str


# Fixed texts: a message never reflects request input, so a crafted link cannot put words
# on the page.
MESSAGES: Final = {
    "approved": "Approved. The command was admitted with exactly the hash you were shown.",
    "denied": "Denied. Nothing will be executed.",
    "pending": "Your approval counts. This request needs more approvers before anything runs.",
    "expired": "This approval expired before it was decided. Nothing was executed; the agent "
               "must propose again.",
    "superseded": "The record changed since the proposal, so this request is superseded and "
                  "can no longer be approved. A new proposal and a new decision are needed.",
    "narrowed": "Narrowed. The narrowed request replaces this one, which never runs.",
    "narrowed_closed": "This request was narrowed by an approver; the narrowed request "
                       "replaced it and this one never runs.",
    "narrow_done": "Narrowed. Your approval is bound to this narrowed request; the original "
                   "never runs.",
    "narrowing_refused": "That edit does not only narrow the request (a larger amount, an "
                         "added item, or a field that may not narrow). Nothing was changed.",
    "invalid_arguments": "The narrowed values are not valid for this action. Nothing was "
                         "changed.",
    "mismatch": "The request pending is not the one you were shown. Nothing was decided; "
                "review it again.",
    "already_decided": "This request was already decided.",
    "not_permitted": "Policy does not let you decide this request (nobody approves their own "
                     "request; refunds over 500.00 need a finance approver).",
    "conflict": "The intent was already admitted with another payload. Nothing was approved.",
    "not_allowlisted": "This action is no longer on the allowlist and cannot be approved.",
    "unreadable": "The proposed arguments cannot be read, so they cannot be approved.",
    "unavailable": "The CRM or the database did not answer. Nothing was decided; try again.",
    "not_found": "No such approval request.",
}


def of(exc: errors.AgentLedgerError) -> Answer:
    """The HTTP status and message key of a refused decision or read."""
    if isinstance(exc, errors.InvalidTransition):
        # Closed meanwhile (e.g. by the expiry sweep): say how, not just "already decided".
        closed = exc.details.get("state")
        if closed == "expired":
            return Answer(410, "expired", MESSAGES["expired"])
        if closed == "superseded":
            return Answer(409, "superseded", MESSAGES["superseded"])
        if closed == "narrowed":
            return Answer(409, "narrowed", MESSAGES["narrowed_closed"])
    # The status is the error's (web.STATUS); the console only picks the words.
    # Subclasses before their parents: StaleRevision and ApprovalMismatch are ValidationFailed.
    codes: tuple[tuple[type[errors.AgentLedgerError], str], ...] = (
        (errors.ApprovalNotFound, "not_found"),
        (errors.CommandNotFound, "not_found"),
        (errors.ApprovalExpired, "expired"),
        (errors.StaleRevision, "superseded"),
        (errors.ApprovalMismatch, "mismatch"),
        (errors.InvalidTransition, "already_decided"),
        (errors.IdempotencyConflict, "conflict"),
        (errors.PolicyDenied, "not_permitted"),
        (errors.UnknownAction, "not_allowlisted"),
        (errors.DecryptionFailed, "unreadable"),
    )
    status = web.status_of(exc)
    for kind, code in codes:
        if isinstance(exc, kind):
            return Answer(status, code, MESSAGES[code])
    if exc.retryable:
        return Answer(status, "unavailable", MESSAGES["unavailable"])
    return Answer(status, exc.code, exc.message)


def approval_id(raw: str) -> UUID:
    """A path's approval id; anything that is not a UUID is simply not found."""
    try:
        return UUID(raw)
    except ValueError as exc:
        raise errors.ApprovalNotFound(approval_id=raw[:64]) from exc
