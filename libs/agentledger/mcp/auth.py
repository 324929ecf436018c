"""Who calls: the same session tokens ingress accepts, verified the same way.

Over streamable HTTP the token is the MCP request's ``Authorization: Bearer <token>``, read
at every request (each request may carry another session); over stdio it is the configured
token of the one agent the process serves. Tenant, principal and roles come only from the
verified claims (:func:`agentledger.identity.verify_session`), and the same token is what
the server forwards to ingress, so ingress verifies it again and derives the operation id
from it. A missing or invalid token is an MCP error: nothing is listed, nothing proposed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from mcp.shared.exceptions import MCPError

from agentledger import errors, identity, web

log = logging.getLogger(__name__)

# JSON-RPC's server-defined range is -32000..-32099; the SDK uses -32000, -32001 and
# -32020..-32042, so this one is ours.
UNAUTHENTICATED: Final = -32040
_MESSAGE: Final = "the session token is missing or invalid"


@dataclass(frozen=True)
class Caller:
    """A verified caller: its session and the token to forward to ingress."""

    session: identity.Session
    token: str


@dataclass(frozen=True)
class Authenticator:
    """Verifies session tokens with the identity provider's keys, like ingress."""

    keys: identity.KeySet
    issuer: str
    audience: str
    stdio_token: str | None = None

    def verify(self, token: str) -> Caller:
        """Verify one token.

        Raises:
            errors.IdentityRejected: Forged, expired, wrong audience or issuer, ...
        """
        return Caller(identity.verify_session(token, self.keys, audience=self.audience,
                                              issuer=self.issuer), token)

    def caller(self, request: Any) -> Caller:
        """The caller of one MCP request: ``request`` is the HTTP request the transport
        attached (``ServerRequestContext.request``), ``None`` on stdio.

        Raises:
            MCPError: ``UNAUTHENTICATED``; the precise reason is logged, not returned (it
                would help forge the next token).
        """
        try:
            if request is not None:
                token = web.bearer(request.headers.get("authorization"))
            elif self.stdio_token:
                token = self.stdio_token
            else:
                raise errors.IdentityRejected("no token configured (AGENTLEDGER_MCP_TOKEN)")
            return self.verify(token)
        except errors.IdentityRejected as exc:
            log.info("event=mcp_caller_rejected reason=%s", exc.message[:200])
            raise MCPError(UNAUTHENTICATED, _MESSAGE, {"code": exc.code}) from exc
