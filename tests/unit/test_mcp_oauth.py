"""Access tokens of an authorization server, checked without one: the JWKS is served by an
``httpx.MockTransport`` (the real Keycloak is tests/e2e/test_mcp_oauth.py's)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from agentledger import errors
from agentledger.mcp import oauth

ISSUER = "https://as.example/realms/agentledger"
RESOURCE = "http://127.0.0.1:8060/mcp"
TENANT = str(uuid.uuid4())
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        (jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm)
        .to_jwk(key.public_key()))
    return {**found, "kid": kid, "alg": alg, "use": "sig"}


class Server:
    """The authorization server's metadata and JWKS, counting fetches."""

    def __init__(self) -> None:
        self.keys = [jwk(RSA_KEY, "k1", "RS256")]
        self.jwks_fetches = 0
        self.body: bytes | None = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/.well-known/openid-configuration"):
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/certs"})
        if request.url.path.endswith("/certs"):
            self.jwks_fetches += 1
            if self.body is not None:
                return httpx.Response(200, content=self.body)
            return httpx.Response(200, json={"keys": self.keys})
        return httpx.Response(404)


def verifier(server: Server, refetch_s: float = 60.0) -> oauth.Verifier:
    http = httpx.AsyncClient(transport=httpx.MockTransport(server.handle))
    return oauth.Verifier(oauth.Jwks(http, issuer=ISSUER, url=None, ttl_s=300, refetch_s=refetch_s),
                          issuer=ISSUER, resource=RESOURCE, tenant_claim="tenant_id",
                          principal_claim="principal", leeway_s=0)


def token(key: Any = RSA_KEY, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": [RESOURCE, "account"], "exp": now + 300, "iat": now,
            "tenant_id": TENANT, "principal": "user:alice", "azp": "agent-alice",
            "scope": "agentledger:tools profile", **claims}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


async def test_a_token_of_the_issuer_for_this_resource_is_verified() -> None:
    found = await verifier(Server()).verify(token())
    assert (str(found.tenant_id), found.principal_id, found.client_id) == (TENANT, "user:alice", "agent-alice")
    assert found.scopes == ("agentledger:tools", "profile")


@pytest.mark.parametrize(("claims", "why"), [
    ({"aud": "http://127.0.0.1:8060/other"}, "another resource"),
    ({"exp": int(time.time()) - 5}, "expired"),
    ({"iss": "https://evil.example"}, "InvalidIssuer"),
    ({"tenant_id": "not-a-uuid"}, "tenant"),
    ({"principal": "user:alice\n"}, "principal"),
    ({"exp": 1e400}, "rejected"),
])
async def test_a_token_that_is_not_for_us_now_is_refused(claims: dict[str, Any], why: str) -> None:
    with pytest.raises(errors.IdentityRejected) as caught:
        await verifier(Server()).verify(token(**claims))
    assert why in caught.value.message


async def test_an_unknown_key_is_refetched_once_per_interval_and_then_refused() -> None:
    server = Server()
    checker = verifier(server)
    await checker.verify(token())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for _ in range(5):
        with pytest.raises(errors.IdentityRejected, match="unknown key"):
            await checker.verify(token(stranger, kid="k9"))
    # One fetch at first use; the unknown kids come within the refetch interval, so none of
    # the five fetches again (a flood of made-up kids costs nothing).
    assert server.jwks_fetches == 1
    # The same kid with another key: the signature does not verify.
    with pytest.raises(errors.IdentityRejected, match="InvalidSignature"):
        await checker.verify(token(stranger, kid="k1"))


async def test_a_rotated_key_is_found_by_refetching() -> None:
    server = Server()
    checker = verifier(server, refetch_s=0)
    await checker.verify(token())
    server.keys.append(jwk(EC_KEY, "k2", "ES256"))
    assert (await checker.verify(token(EC_KEY, kid="k2", alg="ES256"))).principal_id == "user:alice"


async def test_the_header_never_picks_how_a_key_is_used() -> None:
    server = Server()
    public_pem = RSA_KEY.public_key().public_bytes(
        encoding=__import__("cryptography.hazmat.primitives.serialization", fromlist=["x"]).Encoding.PEM,
        format=__import__("cryptography.hazmat.primitives.serialization", fromlist=["x"]).PublicFormat.SubjectPublicKeyInfo)
    # HS256 with the public key as the secret (the classic confusion), and alg=none.
    forged = jwt.encode({"iss": ISSUER}, "s" * 64, algorithm="HS256", headers={"kid": "k1"})
    for bad in (forged, jwt.encode({"iss": ISSUER}, None, algorithm="none", headers={"kid": "k1"})):
        with pytest.raises(errors.IdentityRejected, match="algorithm"):
            await verifier(server).verify(bad)
    assert public_pem  # the key exists; it was never usable as an HMAC secret


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"keys": "none"}',
                                  b'{"keys": [' + b'{"kty": "x"},' * 5000 + b'{}]}'])
async def test_a_broken_jwks_leaves_keys_unknown(body: bytes) -> None:
    server = Server()
    server.body = body
    with pytest.raises(errors.IdentityRejected, match="unknown key"):
        await verifier(server).verify(token())


def test_scopes_from_scope_or_scp() -> None:
    assert oauth.scopes_of({"scope": "a  b"}) == ("a", "b")
    assert oauth.scopes_of({"scp": ["a", 3, "b"]}) == ("a", "b")
    assert oauth.scopes_of({}) == ()
