"""A real Keycloak (the OAuth 2.1 authorization server of the MCP server's tests) on free
ports, bound to 127.0.0.1, with an in-memory database, seeded through its admin API.

Installed by ``deploy/local/keycloak.sh install`` (``bash deploy/local/bootstrap.sh test``
runs it). :func:`running` starts one in dev mode and yields a :class:`Keycloak`;
:meth:`Keycloak.realm` creates a realm whose confidential clients stand for agents: each
client's service account is one principal of one tenant (hardcoded ``tenant_id`` and
``principal`` claims, the directory's roles as realm roles and a ``roles`` claim), its tokens
name the resource (the MCP server's canonical URI) in ``aud`` and carry the scopes it is
given. A realm may also hold people (users who sign in on Keycloak's login page, their
``tenant_id`` and ``principal`` user attributes mapped into the token) and one public client
for them: the authorization-code flow with PKCE (S256 required), one exact redirect URI.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mcp.client.auth import TokenStorage
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from agentledger import settings
from agentledger.testing.polling import wait_until
from agentledger.testing.processes import free_ports, terminate

VERSION = "26.5.6"
# A cold Keycloak on a free 2-core box boots in ~25 s; a loaded CI box takes several times that.
START_TIMEOUT_S = 240.0
INSTALL = "bash deploy/local/keycloak.sh install (make test runs it)"
TOOLS_SCOPE = "agentledger:tools"


def _home() -> Path:
    local = Path(os.environ.get("AGENTLEDGER_LOCAL_DIR") or settings.REPO_ROOT / ".local")
    return Path(os.environ.get("AGENTLEDGER_KEYCLOAK_HOME")
                or local / "keycloak" / f"keycloak-{VERSION}")


def installed() -> bool:
    """Whether ``deploy/local/keycloak.sh install`` has unpacked it."""
    return (_home() / "bin" / "kc.sh").is_file()


def home() -> Path:
    """Unpacked by ``deploy/local/keycloak.sh install``."""
    found = _home()
    assert installed(), f"{found}/bin/kc.sh is missing: {INSTALL}"
    return found


@dataclass(frozen=True)
class Agent:
    """A confidential client whose service account is one principal of one tenant."""

    client_id: str
    tenant_id: str
    principal: str
    roles: Sequence[str] = ()
    scopes: Sequence[str] = (TOOLS_SCOPE,)
    audience: str | None = None  # None: the realm's resource
    token_lifespan_s: int | None = None
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))


@dataclass(frozen=True)
class Person:
    """A user who signs in with a password; one principal of one tenant."""

    username: str
    tenant_id: str
    principal: str
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))


@dataclass(frozen=True)
class PublicClient:
    """A public client for people: authorization code with PKCE S256, no secret."""

    client_id: str
    redirect_uri: str
    scopes: Sequence[str] = (TOOLS_SCOPE,)


@dataclass(frozen=True)
class Realm:
    """A seeded realm: its issuer and agents."""

    base_url: str
    name: str
    agents: Mapping[str, Agent]
    people: Mapping[str, Person] = field(default_factory=dict)

    @property
    def issuer(self) -> str:
        return f"{self.base_url}/realms/{self.name}"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    def token(self, client_id: str) -> dict[str, Any]:
        """A client-credentials token response for one agent.

        Raises:
            httpx.HTTPStatusError: Keycloak refused.
        """
        agent = self.agents[client_id]
        answer = httpx.post(self.token_endpoint, data={"grant_type": "client_credentials"},
                            auth=(agent.client_id, agent.secret), timeout=30)
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found


@dataclass(frozen=True)
class Keycloak:
    """Where one running Keycloak listens, and its admin's credentials."""

    base_url: str
    admin_password: str

    def _admin_token(self) -> str:
        answer = httpx.post(
            f"{self.base_url}/realms/master/protocol/openid-connect/token",
            data={"grant_type": "password", "client_id": "admin-cli", "username": "admin",
                  "password": self.admin_password}, timeout=30)
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def realm(self, name: str, resource: str, agents: Sequence[Agent],
              people: Sequence[Person] = (), public_client: PublicClient | None = None
              ) -> Realm:
        """Create realm ``name`` for ``resource`` with ``agents`` (one admin API call), and
        ``people`` with ``public_client`` (two calls for the user profile, one per person).

        Raises:
            httpx.HTTPStatusError: Keycloak refused the realm or a person.
        """
        roles = sorted({role for agent in agents for role in agent.roles})
        representation = {
            "realm": name, "enabled": True,
            "roles": {"realm": [{"name": role} for role in roles]},
            "clientScopes": [{
                "name": TOOLS_SCOPE, "protocol": "openid-connect",
                "attributes": {"include.in.token.scope": "true",
                               "display.on.consent.screen": "false"}}],
            "clients": [_client(agent, resource) for agent in agents]
                       + ([_public_client(public_client, resource)] if public_client else []),
            "users": [{"username": f"service-account-{agent.client_id}", "enabled": True,
                       "serviceAccountClientId": agent.client_id,
                       "realmRoles": list(agent.roles)} for agent in agents],
        }
        admin = {"Authorization": f"Bearer {self._admin_token()}"}
        answer = httpx.post(f"{self.base_url}/admin/realms", json=representation,
                            headers=admin, timeout=60)
        answer.raise_for_status()
        if people:
            self._add_people(name, people, admin)
        return Realm(self.base_url, name, {agent.client_id: agent for agent in agents},
                     {person.username: person for person in people})

    def _add_people(self, realm: str, people: Sequence[Person], admin: Mapping[str, str]
                    ) -> None:
        base = f"{self.base_url}/admin/realms/{realm}"
        # Keycloak 26's user profile drops attributes it does not declare: let the realm keep
        # ours (tenant_id, principal), which only the admin API sets.
        profile = httpx.get(f"{base}/users/profile", headers=admin, timeout=30)
        profile.raise_for_status()
        changed = {**profile.json(), "unmanagedAttributePolicy": "ADMIN_EDIT"}
        httpx.put(f"{base}/users/profile", json=changed, headers=admin,
                  timeout=30).raise_for_status()
        for person in people:
            # Every attribute the default profile requires is set, so the login page signs in
            # without an "update your account" step.
            httpx.post(f"{base}/users", headers=admin, timeout=30, json={
                "username": person.username, "enabled": True, "emailVerified": True,
                "email": f"{person.username}@example.test", "firstName": person.username,
                "lastName": "Test", "requiredActions": [],
                "attributes": {"tenant_id": [person.tenant_id], "principal": [person.principal]},
                "credentials": [{"type": "password", "value": person.password,
                                 "temporary": False}]}).raise_for_status()


def _mapper(name: str, kind: str, config: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "protocol": "openid-connect", "protocolMapper": kind,
            "config": {"access.token.claim": "true", "id.token.claim": "false",
                       "introspection.token.claim": "true", **config}}


def _client(agent: Agent, resource: str) -> dict[str, Any]:
    attributes = {}
    if agent.token_lifespan_s is not None:
        attributes["access.token.lifespan"] = str(agent.token_lifespan_s)
    return {
        "clientId": agent.client_id, "enabled": True, "protocol": "openid-connect",
        "publicClient": False, "secret": agent.secret, "serviceAccountsEnabled": True,
        "standardFlowEnabled": False, "directAccessGrantsEnabled": False,
        "fullScopeAllowed": True, "defaultClientScopes": list(agent.scopes),
        "optionalClientScopes": [], "attributes": attributes,
        "protocolMappers": [
            _mapper("audience", "oidc-audience-mapper",
                    {"included.custom.audience": agent.audience or resource}),
            _mapper("tenant", "oidc-hardcoded-claim-mapper",
                    {"claim.name": "tenant_id", "claim.value": agent.tenant_id,
                     "jsonType.label": "String"}),
            _mapper("principal", "oidc-hardcoded-claim-mapper",
                    {"claim.name": "principal", "claim.value": agent.principal,
                     "jsonType.label": "String"}),
            _mapper("roles", "oidc-usermodel-realm-role-mapper",
                    {"claim.name": "roles", "multivalued": "true",
                     "jsonType.label": "String"}),
        ],
    }


def _public_client(client: PublicClient, resource: str) -> dict[str, Any]:
    def attribute(claim: str) -> dict[str, Any]:
        return _mapper(claim, "oidc-usermodel-attribute-mapper",
                       {"user.attribute": claim, "claim.name": claim,
                        "jsonType.label": "String"})
    return {
        "clientId": client.client_id, "enabled": True, "protocol": "openid-connect",
        "publicClient": True, "standardFlowEnabled": True, "serviceAccountsEnabled": False,
        "directAccessGrantsEnabled": False, "implicitFlowEnabled": False,
        "redirectUris": [client.redirect_uri], "webOrigins": [],
        "fullScopeAllowed": True, "defaultClientScopes": list(client.scopes),
        "optionalClientScopes": [],
        # PKCE required, S256 only: a code without the verifier is refused.
        "attributes": {"pkce.code.challenge.method": "S256"},
        "protocolMappers": [
            _mapper("audience", "oidc-audience-mapper", {"included.custom.audience": resource}),
            attribute("tenant_id"), attribute("principal"),
            # Who signed in, by name (the `profile` scope is not asked for).
            _mapper("username", "oidc-usermodel-property-mapper",
                    {"user.attribute": "username", "claim.name": "preferred_username",
                     "jsonType.label": "String"}),
        ],
    }


def command(http_port: int, management_port: int) -> list[str]:
    """The command line of a dev-mode Keycloak (in-memory database) on 127.0.0.1."""
    return [str(home() / "bin" / "kc.sh"), "start-dev", "--http-host=127.0.0.1",
            f"--http-port={http_port}", f"--http-management-port={management_port}",
            "--db=dev-mem", "--health-enabled=false", "--metrics-enabled=false"]


def environment(admin_password: str) -> dict[str, str]:
    """Its bootstrap admin, and a bounded heap: it shares a 2-core box with Kafka, Postgres
    and the services."""
    return {"KC_BOOTSTRAP_ADMIN_USERNAME": "admin", "KC_BOOTSTRAP_ADMIN_PASSWORD": admin_password,
            "JAVA_OPTS_KC_HEAP": "-Xms64m -Xmx512m"}


def answers(base_url: str) -> bool:
    """Whether the Keycloak at ``base_url`` serves its master realm (it is up)."""
    try:
        return httpx.get(f"{base_url}/realms/master", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running() -> Iterator[Keycloak]:
    """A Keycloak of its own (dev mode, in-memory database), stopped after."""
    ports = free_ports({"http": None, "management": None})
    password = secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory(prefix="al-keycloak-") as tmp:
        log_path = Path(tmp) / "keycloak.log"
        log = open(log_path, "wb")
        proc = subprocess.Popen(  # noqa: S603 (our own install of it)
            command(ports["http"], ports["management"]),
            env={**os.environ, **environment(password)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        found = Keycloak(f"http://127.0.0.1:{ports['http']}", password)
        try:
            def ready() -> bool:
                if proc.poll() is not None:
                    return True  # reported below
                return answers(found.base_url)
            up = wait_until(ready, timeout=START_TIMEOUT_S, interval=0.5)
            assert up and proc.poll() is None, (
                "Keycloak did not answer:\n" + log_path.read_text(errors="replace")[-4000:])
            yield found
        finally:
            terminate(proc, grace=30)
            log.close()


class MemoryTokens(TokenStorage):
    """The MCP SDK client's token storage, in memory: one client's tokens and registration
    (the demo's story and the OAuth tests each hold one per client)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info
