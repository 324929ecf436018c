"""The CRM's HTTP-facing errors: each carries its status and a stable code.

The CRM plays an external business system, so its errors are its own API contract, not
``agentledger.errors``; ``app`` turns them into ``{"error": {"code", "message"}}`` in one place.
"""

from __future__ import annotations

from typing import ClassVar


class CrmError(Exception):
    """The CRM could not process the request."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        super().__init__(self.message)


class Unauthenticated(CrmError):
    """A valid bearer token is required."""

    status = 401
    code = "unauthenticated"


class Forbidden(CrmError):
    """The token lacks the scope this operation needs."""

    status = 403
    code = "insufficient_scope"


class NotFound(CrmError):
    """Not found."""

    # Same answer for "missing" and "belongs to another tenant".
    status = 404
    code = "not_found"


class PreconditionFailed(CrmError):
    """If-Match does not match the current revision."""

    status = 412
    code = "precondition_failed"


class PreconditionRequired(CrmError):
    """This operation requires an If-Match header naming the expected revision."""

    status = 428
    code = "precondition_required"


class InvalidHeader(CrmError):
    """A header is malformed."""

    status = 400
    code = "invalid_header"


class KeyReused(CrmError):
    """This Idempotency-Key was already used for a different request."""

    status = 422
    code = "idempotency_key_reused"


class StaleFencingToken(CrmError):
    """A higher fencing token was already seen for this key: this writer is stale; nothing
    was applied."""

    # A conflict with the key's state, not a malformed request: the caller's claim is over.
    status = 409
    code = "stale_fencing_token"


class DeadlinePassed(CrmError):
    """The request arrived after the deadline it carries (Request-Deadline): nothing was
    applied."""

    # The caller gave up on it already; applying it now would surprise whoever decided next.
    status = 408
    code = "deadline_passed"


class UnstorableInput(CrmError):
    """The request holds data the database refuses (a NUL character, a value out of range)."""

    # A refusal of bad input, not an outage: a 503 would have the caller retry it forever.
    status = 422
    code = "unstorable_input"


class StorageError(CrmError):
    """The CRM's database could not complete the operation."""

    status = 503
    code = "storage_unavailable"


class FaultInjected(CrmError):
    """Injected failure before commit; nothing was written."""

    status = 503
    code = "fault_injected"
