"""Who calls: an OAuth 2.1 access token of the configured authorization server, or one of the
project's session tokens where those are configured; then the principal directory.

Over streamable HTTP the token is each request's ``Authorization: Bearer <token>``, checked
by the SDK's bearer middleware (``mcp.server.auth``) with :class:`Gate` as its
``TokenVerifier``: a missing or invalid token is HTTP 401, a token without the required
scope HTTP 403 ``insufficient_scope``, both with a ``WWW-Authenticate`` challenge naming the
Protected Resource Metadata and the scope (:mod:`agentledger.mcp.server`). Over stdio it is
the configured token of the one agent the process serves; a refusal there is a JSON-RPC
``INVALID_REQUEST`` error (stdio has no HTTP status), never a code the specification reserves.

Tenant, principal and roles come only from the verified token and the directory: the
directory must hold the principal in the token's tenant, not revoked (else the token is
refused like an invalid one: nothing listed, nothing proposed), and its roles — not the
token's — decide what is listed. Ingress gets a session token: the caller's own when it sent
one, else one this server signs for the verified principal (``exchange_key``); an OAuth
access token is never forwarded anywhere (no token passthrough).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import jwt
from mcp.server.auth.provider import AccessToken
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST
from pydantic import ConfigDict

from agentledger import errors, identity
from agentledger.mcp import directory as directory_mod
from agentledger.mcp import oauth

log = logging.getLogger(__name__)

_MESSAGE: Final = "the token is missing or invalid"
# The session token this server signs for an OAuth caller lives as long as one call can
# (the wait bound with margin), and never past the access token it stands for.
EXCHANGE_TTL_S: Final = 300


@dataclass(frozen=True)
class Caller:
    """A verified caller: its session (tenant, principal, the directory's roles) and the
    session token ingress gets for it."""

    session: identity.Session
    token: str


class CallerToken(AccessToken):
    """The SDK's ``AccessToken`` carrying the verified :class:`Caller`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    caller: Any = None


@dataclass(frozen=True)
class Exchange:
    """How this server signs ingress' session token for an OAuth caller."""

    private_pem: str
    kid: str
    issuer: str
    audience: str


class Gate:
    """Verifies a bearer token and checks its principal against the directory."""

    def __init__(self, *, directory: directory_mod.Directory,
                 oauth_verifier: oauth.Verifier | None, session_keys: identity.KeySet | None,
                 session_issuer: str | None, session_audience: str,
                 exchange: Exchange | None, scopes: Sequence[str],
                 stdio_token: str | None = None) -> None:
        self.directory, self.oauth_verifier = directory, oauth_verifier
        self._keys, self._issuer, self._audience = session_keys, session_issuer, session_audience
        self._exchange, self.scopes, self._stdio_token = exchange, tuple(scopes), stdio_token

    async def verify(self, token: str) -> tuple[Caller, tuple[str, ...], str]:
        """(the caller, the scopes its token grants, its client id).

        Raises:
            errors.IdentityRejected: The token is not valid here, or its principal is not a
                current principal of its tenant.
            errors.StorageError: The directory did not answer.
        """
        issuer = _unverified_issuer(token)
        if self.oauth_verifier is not None and issuer == self.oauth_verifier.issuer:
            claims = await self.oauth_verifier.verify(token)
            found = await self.directory.principal(claims.tenant_id, claims.principal_id)
            assert self._exchange is not None  # settings require it with an OAuth issuer
            ttl = max(1, min(EXCHANGE_TTL_S, claims.expires_at - int(time.time())))
            roles = tuple(sorted(found.roles))
            forwarded = identity.issue_session(
                self._exchange.private_pem, self._exchange.kid, tenant_id=claims.tenant_id,
                subject=claims.principal_id, audience=self._exchange.audience,
                issuer=self._exchange.issuer, ttl_s=ttl, roles=roles)
            session = identity.Session(claims.tenant_id, claims.principal_id, roles,
                                       datetime.fromtimestamp(claims.expires_at, UTC))
            return Caller(session, forwarded), claims.scopes, claims.client_id
        if self._keys is not None and self._issuer is not None:
            verified = identity.verify_session(token, self._keys, audience=self._audience,
                                               issuer=self._issuer)
            found = await self.directory.principal(verified.tenant_id, verified.principal_id)
            session = identity.Session(verified.tenant_id, verified.principal_id,
                                       tuple(sorted(found.roles)), verified.expires_at)
            # A session token carries no OAuth scope: where session tokens are configured,
            # they are let in as they always were.
            return Caller(session, token), self.scopes, verified.principal_id
        raise errors.IdentityRejected("token of an issuer this server does not accept")

    async def verify_token(self, token: str) -> AccessToken | None:
        """The SDK's ``TokenVerifier``: ``None`` (→ HTTP 401) for any refused token."""
        try:
            caller, scopes, client_id = await self.verify(token)
        except errors.IdentityRejected as exc:
            log.info("event=mcp_caller_rejected reason=%s", exc.message[:200])
            return None
        return CallerToken(token="", client_id=client_id, scopes=list(scopes),
                           expires_at=int(caller.session.expires_at.timestamp()),
                           subject=caller.session.principal_id, caller=caller)

    async def caller(self, request: Any) -> Caller:
        """The caller of one MCP request: ``request`` is the HTTP request the transport
        attached (``ServerRequestContext.request``; the bearer middleware verified it),
        ``None`` on stdio (the configured token is verified now).

        Raises:
            MCPError: ``INVALID_REQUEST`` on stdio for a refused token; the precise reason is
                logged, not returned (it would help forge the next token).
        """
        if request is not None:
            user = request.scope.get("user")
            found = getattr(getattr(user, "access_token", None), "caller", None)
            if isinstance(found, Caller):
                return found
            # Unreachable behind the bearer middleware; refused all the same.
            raise MCPError(INVALID_REQUEST, _MESSAGE)
        try:
            if not self._stdio_token:
                raise errors.IdentityRejected("no token configured (AGENTLEDGER_MCP_TOKEN)")
            return (await self.verify(self._stdio_token))[0]
        except errors.IdentityRejected as exc:
            log.info("event=mcp_caller_rejected reason=%s", exc.message[:200])
            raise MCPError(INVALID_REQUEST, _MESSAGE, {"reason": "unauthenticated"}) from exc


def _unverified_issuer(token: str) -> object:
    # Only to pick which verifier checks the token; nothing of it is trusted before that.
    try:
        return jwt.decode(token, options={"verify_signature": False}).get("iss")
    except (jwt.PyJWTError, ValueError, TypeError):
        return None
