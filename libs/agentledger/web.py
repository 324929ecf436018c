"""HTTP pieces the services' shells share (ingress, console, MCP): the body limit, the bearer
header, and the one table from error class to HTTP status.

Each shell used to map errors itself, and the two tables drifted; the status of an error is
a property of the error, so it is decided here, and a shell only chooses how to word it.
"""

from __future__ import annotations

import json
from typing import Final

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentledger import errors

# Error class → HTTP status, subclasses before their parents (the first match wins):
# StaleRevision and ApprovalMismatch are ValidationFailed, AccessDenied is a StorageError.
STATUS: Final[tuple[tuple[type[errors.AgentLedgerError], int], ...]] = (
    (errors.IdentityRejected, 401),
    (errors.ApprovalNotFound, 404),
    (errors.CommandNotFound, 404),
    (errors.ApprovalExpired, 410),
    (errors.StaleRevision, 409),
    (errors.ApprovalMismatch, 422),
    (errors.NarrowingRefused, 422),
    (errors.InvalidTransition, 409),
    (errors.IdempotencyConflict, 409),
    (errors.PolicyDenied, 403),
    (errors.UnknownAction, 409),
    (errors.DecryptionFailed, 409),
)
# Whatever the table does not name: retryable → 503 (try again), else 400 (fix the request).
RETRYABLE_STATUS: Final = 503
REJECTED_STATUS: Final = 400


def status_of(exc: errors.AgentLedgerError) -> int:
    """The HTTP status that answers ``exc`` (see :data:`STATUS`)."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return RETRYABLE_STATUS if exc.retryable else REJECTED_STATUS


def bearer(authorization: str | bytes | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value (an HTTP header or a Kafka
    record's ``authorization`` header).

    Raises:
        errors.IdentityRejected: No bearer token.
    """
    text = authorization.decode("latin-1") if isinstance(authorization, bytes) else authorization
    scheme, _, token = (text or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise errors.IdentityRejected("a bearer session token is required")
    return token.strip()


class BodyLimit:
    """Refuse bodies over ``limit`` bytes (413) before anything parses them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # chunked bodies declare no length
                    raise HTTPException(413, f"body larger than {self.limit} bytes")
            return message

        await self.app(scope, limited, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Raw ASGI: the answer goes out before any framework has read (or parsed) the body.
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"body larger than {self.limit} bytes"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
