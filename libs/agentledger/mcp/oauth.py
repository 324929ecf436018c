"""OAuth 2.1 access tokens of an authorization server: signature by its JWKS, issuer,
audience = this server's canonical URI (RFC 8707), expiry, scopes, tenant and principal.

The issuer's signing keys (:class:`Jwks`) are fetched from its ``jwks_uri`` (configured, or
read from its metadata), cached for a TTL, and fetched again when a token names a ``kid``
the cache does not hold (a key rotation) — at most once per ``refetch_s``, so a flood of
tokens with made-up ``kid`` values costs one fetch per interval, not one each. A key is used
only with the algorithm its JWK names; the token header never picks it.

What comes back from the authorization server is untrusted too: a JWKS answer that is not
JSON, too large, or holds unusable keys leaves the cache as it was (an unknown key stays
unknown: the token is refused).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import jwt

from agentledger import errors, identity

log = logging.getLogger(__name__)

# Asymmetric algorithms only: an HMAC "key" would be a shared secret, and `none` no key.
ALGORITHMS: Final = ("RS256", "PS256", "ES256", "EdDSA")
# A JWKS is a few keys; anything larger is not one (and is not read into memory).
MAX_JWKS_BYTES: Final = 64 * 1024
MAX_KEYS: Final = 32
# The authorization server answers in well under a second; a hung one must not hold a
# request's verification longer than this.
FETCH_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class Claims:
    """What a verified access token says."""

    tenant_id: uuid.UUID
    principal_id: str
    client_id: str
    scopes: tuple[str, ...]
    expires_at: int


class Jwks:
    """The issuer's signing keys by ``kid``, cached, refetched on an unknown ``kid``."""

    def __init__(self, http: httpx.AsyncClient, *, issuer: str, url: str | None,
                 ttl_s: float, refetch_s: float) -> None:
        self._http, self._issuer, self._url = http, issuer, url
        self._ttl_s, self._refetch_s = ttl_s, refetch_s
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key named ``kid``.

        Raises:
            errors.IdentityRejected: No such key, even after a (bounded) refetch.
        """
        now = time.monotonic()
        stale = self._fetched_at is None or now - self._fetched_at >= self._ttl_s
        if kid not in self._keys or stale:
            async with self._lock:
                again = self._fetched_at is None or (
                    time.monotonic() - self._fetched_at >= (self._ttl_s if kid in self._keys
                                                            else self._refetch_s))
                if again:
                    await self._refresh()
        found = self._keys.get(kid)
        if found is None:
            raise errors.IdentityRejected("token signed by an unknown key")
        return found

    async def _refresh(self) -> None:
        self._fetched_at = time.monotonic()
        self.fetches += 1
        try:
            url = self._url or await self._discover()
            document = await self._get_json(url)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("event=mcp_jwks_unreadable error=%s", type(exc).__name__)
            return
        keys = document.get("keys")
        if not isinstance(keys, list):
            log.warning("event=mcp_jwks_unreadable error=no_keys")
            return
        found: dict[str, jwt.PyJWK] = {}
        for entry in keys[:MAX_KEYS]:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            kid = entry.get("kid")
            try:
                key = jwt.PyJWK(entry)
            except (jwt.PyJWTError, ValueError, TypeError, KeyError):
                continue
            if isinstance(kid, str) and key.algorithm_name in ALGORITHMS:
                found[kid] = key
        self._keys = found
        log.info("event=mcp_jwks_fetched keys=%d", len(found))

    async def _discover(self) -> str:
        # RFC 8414 first, then OpenID Connect discovery (what Keycloak and most IdPs serve).
        base = self._issuer.rstrip("/")
        for url in (f"{base}/.well-known/oauth-authorization-server",
                    f"{base}/.well-known/openid-configuration"):
            try:
                metadata = await self._get_json(url)
            except (httpx.HTTPError, ValueError):
                continue
            if metadata.get("issuer") == self._issuer and isinstance(
                    metadata.get("jwks_uri"), str):
                self._url = str(metadata["jwks_uri"])
                return self._url
        raise ValueError("no authorization server metadata with a jwks_uri for the issuer")

    async def _get_json(self, url: str) -> dict[str, Any]:
        async with self._http.stream("GET", url, timeout=FETCH_TIMEOUT_S,
                                     follow_redirects=False) as answer:
            if answer.status_code != 200:
                raise ValueError(f"HTTP {answer.status_code}")
            body = b""
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError("answer too large")
        found = json.loads(body)
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        return found


@dataclass(frozen=True)
class Verifier:
    """Verifies the access tokens of one authorization server for one resource."""

    jwks: Jwks
    issuer: str
    resource: str
    tenant_claim: str
    principal_claim: str
    leeway_s: float
    algorithms: Sequence[str] = ALGORITHMS

    async def verify(self, token: str) -> Claims:
        """The verified claims of ``token``.

        Raises:
            errors.IdentityRejected: Malformed, an unknown key, another algorithm than its
                key's, a bad signature, another issuer or audience, expired, or no usable
                tenant or principal claim. The message names which (for logs, not callers).
        """
        if not token or len(token) > identity.MAX_TOKEN_CHARS:
            raise errors.IdentityRejected("token missing or too long")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise errors.IdentityRejected("token is not a JWS") from exc
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise errors.IdentityRejected("token names no key")
        key = await self.jwks.key(kid)
        if header.get("alg") != key.algorithm_name or key.algorithm_name not in self.algorithms:
            raise errors.IdentityRejected("token algorithm not allowed for its key")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[key.algorithm_name], audience=self.resource,
                issuer=self.issuer, leeway=self.leeway_s,
                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError as exc:
            raise errors.IdentityRejected("token expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise errors.IdentityRejected("token issued for another resource") from exc
        except (jwt.PyJWTError, ValueError, TypeError, OverflowError) as exc:
            raise errors.IdentityRejected(f"token rejected: {type(exc).__name__}") from exc
        return _claims(claims, self.tenant_claim, self.principal_claim)


def _claims(claims: Mapping[str, Any], tenant_claim: str, principal_claim: str) -> Claims:
    exp = claims.get("exp")
    if not isinstance(exp, int) or isinstance(exp, bool):
        raise errors.IdentityRejected("claim exp is not an integer")
    tenant = claims.get(tenant_claim)
    try:
        tenant_id = uuid.UUID(tenant) if isinstance(tenant, str) else None
    except ValueError:
        tenant_id = None
    if tenant_id is None:
        raise errors.IdentityRejected(f"claim {tenant_claim} is not a tenant id")
    principal = claims.get(principal_claim)
    if not isinstance(principal, str) or not identity.is_principal_id(principal):
        raise errors.IdentityRejected(f"claim {principal_claim} is not a principal id")
    client = claims.get("azp") or claims.get("client_id") or principal
    return Claims(tenant_id, principal, str(client)[:256], scopes_of(claims), exp)


def scopes_of(claims: Mapping[str, Any]) -> tuple[str, ...]:
    """The scopes a token grants: ``scope`` (RFC 9068, space-separated) or ``scp`` (a list)."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return tuple(s for s in scope.split(" ") if s)
    scp = claims.get("scp")
    if isinstance(scp, list):
        return tuple(s for s in scp if isinstance(s, str))
    return ()
