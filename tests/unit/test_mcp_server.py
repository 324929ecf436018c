"""The MCP server's wiring, in process: who is listed what, and who is refused — with the
directory as a table in memory (the real one is read in tests/e2e/test_mcp*.py)."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST
from starlette.testclient import TestClient

from agentledger import errors, identity
from agentledger.mcp import auth, directory, results, server
from agentledger.mcp.settings import McpSettings
from agentledger.policy import cedar

PRIVATE, PUBLIC = identity.generate_keypair("EdDSA")
OTHER, _ = identity.generate_keypair("EdDSA")
ISS, AUD, KID = "https://idp.example", "agentledger-ingress", "idp-1"
TENANT = uuid.uuid4()


def token(roles: list[str], private: str = PRIVATE, subject: str = "user:alice") -> str:
    return identity.issue_session(private, KID, tenant_id=TENANT, subject=subject,
                                  audience=AUD, issuer=ISS, roles=roles)


class Table(directory.Directory):
    """The directory as a dict: (tenant, principal) → (roles, revoked)."""

    def __init__(self, entries: dict[tuple[uuid.UUID, str], tuple[list[str], bool]]) -> None:
        super().__init__()
        self.entries = entries

    async def open(self, url: str, *, role: str | None, size: int) -> None:
        return None

    async def close(self) -> None:
        return None

    async def principal(self, tenant_id: uuid.UUID, principal_id: str) -> cedar.Principal:
        found = self.entries.get((tenant_id, principal_id))
        if found is None:
            raise errors.IdentityRejected("principal unknown in the directory of its tenant")
        if found[1]:
            raise errors.IdentityRejected("principal revoked in the directory")
        return cedar.Principal(tenant_id, principal_id, frozenset(found[0]), False)


DIRECTORY = {(TENANT, "user:alice"): (["user"], False), (TENANT, "user:bob"): (["approver"], False),
             (TENANT, "user:rex"): (["user"], True)}


def settings(stdio_token: str | None = None, **more: object) -> McpSettings:
    return McpSettings.model_validate({
        "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:9", "AGENTLEDGER_DATABASE_URL": "postgresql://x/y",
        "session_keys": {KID: PUBLIC}, "session_issuer": ISS, "session_audience": AUD,
        "token": stdio_token, **more})


def gate(cfg: McpSettings) -> auth.Gate:
    found = server.gate(cfg, httpx.AsyncClient())
    found.directory = Table(DIRECTORY)
    return found


def built(stdio_token: str) -> server.Server:  # type: ignore[type-arg]
    cfg = settings(stdio_token)
    return server.build(cfg, gate(cfg))


async def test_a_session_token_is_verified_like_ingress_does_and_the_directory_gives_the_roles() -> None:
    caller, scopes, client_id = await gate(settings()).verify(token(["approver", "user"]))
    assert (caller.session.tenant_id, caller.session.principal_id, caller.session.roles) == (
        TENANT, "user:alice", ("user",))  # the directory's roles, not the token's
    assert scopes == ("agentledger:tools",) and client_id == "user:alice"


@pytest.mark.parametrize("bad", ["", "not-a-jwt", token(["user"], OTHER),
                                 token(["user"], subject="user:rex"),      # revoked
                                 token(["user"], subject="user:zed")])     # not in the directory
async def test_a_refused_token_is_none_for_the_bearer_middleware(bad: str) -> None:
    assert await gate(settings()).verify_token(bad) is None


async def test_stdio_uses_the_configured_token_and_refuses_with_a_standard_code() -> None:
    assert (await gate(settings(token(["user"]))).caller(None)).session.principal_id == "user:alice"
    for configured in (None, token(["user"], OTHER)):
        with pytest.raises(MCPError) as caught:
            await gate(settings(configured)).caller(None)
        assert caught.value.code == INVALID_REQUEST  # never one of the reserved -32020..-32099


async def test_in_process_listing_follows_the_directory() -> None:
    async with Client(built(token(["user"]))) as mcp:
        tools = (await mcp.list_tools()).tools
    names = [t.name for t in tools]
    assert {"billing.refund.create", "crm.contact.update", "crm.note.create"} <= set(names)
    assert names[-1] == "agentledger_status"
    # Every tool declares what its structuredContent holds.
    assert all(t.output_schema == results.OUTPUT_SCHEMA for t in tools)
    async with Client(built(token(["user"], subject="user:bob"))) as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == ["agentledger_status"]


def _mcp_error(exc: BaseException) -> MCPError | None:
    # The client raises a server's error inside its task groups: an ExceptionGroup around it.
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _mcp_error(inner)
        if found is not None:
            return found
    return None


async def test_in_process_an_invalid_token_lists_nothing() -> None:
    with pytest.raises(BaseException) as caught:
        async with Client(built(token(["user"], OTHER))) as mcp:
            await mcp.list_tools()
    found = _mcp_error(caught.value)
    assert found is not None and found.code == INVALID_REQUEST


async def test_in_process_an_unlisted_tool_is_an_mcp_error_before_anything_is_sent() -> None:
    # The bootstrap and ingress are unreachable: an attempt to send would not end this way.
    with pytest.raises(BaseException) as caught:
        async with Client(built(token([], subject="user:bob"))) as mcp:
            await mcp.call_tool("crm.note.create", {"customer_id": "c", "body": "b", "target": "c"})
    found = _mcp_error(caught.value)
    assert found is not None and found.message == "no tool named 'crm.note.create' for this caller"


def test_over_http_no_token_is_401_with_a_challenge_naming_the_metadata_and_scope() -> None:
    cfg = settings(resource_url="http://127.0.0.1:8060/mcp", oauth_issuer="https://as.example",
                   exchange_key=PRIVATE)
    app = server.http_app(server.build(cfg, gate(cfg)), cfg, gate(cfg))
    with TestClient(app, base_url="http://127.0.0.1:8060") as http:
        answer = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert answer.status_code == 401
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
        assert ('resource_metadata="http://127.0.0.1:8060/.well-known/oauth-protected-resource/mcp"'
                in challenge) and 'scope="agentledger:tools"' in challenge
        metadata = http.get("/.well-known/oauth-protected-resource/mcp").json()
        assert metadata["resource"] == "http://127.0.0.1:8060/mcp"
        assert metadata["authorization_servers"] == ["https://as.example"]
        assert metadata["scopes_supported"] == ["agentledger:tools"]
        forged = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                           headers={"Authorization": f"Bearer {token(['user'], OTHER)}"})
        assert forged.status_code == 401 and "invalid_token" in forged.headers["www-authenticate"]


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_BOOTSTRAP", "k:1")
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", "postgresql://x/y")
    monkeypatch.setenv("AGENTLEDGER_MCP_SESSION_KEYS", json.dumps({KID: PUBLIC}))
    monkeypatch.setenv("AGENTLEDGER_MCP_SESSION_ISSUER", ISS)
    monkeypatch.setenv("AGENTLEDGER_MCP_WAIT_S", "5")
    monkeypatch.setenv("AGENTLEDGER_MCP_TOKEN", "t")
    found = McpSettings.model_validate({"transport": "http"})
    assert (found.kafka_bootstrap, found.wait_s, found.transport, found.port) == ("k:1", 5.0, "http", 8060)
    assert found.token is not None and found.token.get_secret_value() == "t"


@pytest.mark.parametrize("missing", [
    {"session_keys": {}},                                          # no way in at all
    {"oauth_issuer": "https://as.example"},                        # no resource URL, no exchange key
    {"oauth_issuer": "https://as.example", "resource_url": "http://h/mcp"},  # no exchange key
])
def test_settings_without_a_way_in_are_refused(missing: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        settings(**missing)


MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientCapabilities": {}}


def test_both_protocol_eras_are_served_statelessly_on_one_endpoint() -> None:
    # 2026-07-28: each request carries its version and capabilities, no handshake, no
    # session; 2025-11-25: `initialize`, answered without an Mcp-Session-Id (stateless).
    cfg = settings()
    app = server.http_app(server.build(cfg, gate(cfg)), cfg, gate(cfg))
    headers = {"Authorization": f"Bearer {token(['user'])}",
               "Accept": "application/json, text/event-stream"}
    with TestClient(app, base_url="http://127.0.0.1:8060") as http:
        def modern(method: str, request_id: int) -> httpx.Response:
            return http.post("/mcp", json={"jsonrpc": "2.0", "id": request_id, "method": method,
                                           "params": {"_meta": MODERN}},
                             headers={**headers, "MCP-Protocol-Version": "2026-07-28",
                                      "Mcp-Method": method})
        discovered = modern("server/discover", 1)
        assert discovered.status_code == 200
        assert "2026-07-28" in discovered.json()["result"]["supportedVersions"]
        # A first request of any kind works alone: nothing was negotiated before it.
        listed = modern("tools/list", 2)
        assert listed.status_code == 200 and "mcp-session-id" not in listed.headers
        result = listed.json()["result"]
        assert result["cacheScope"] == "private"  # the listing is per caller
        assert result["tools"][-1]["name"] == "agentledger_status"
        legacy = http.post("/mcp", json={
            "jsonrpc": "2.0", "id": 3, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "old", "version": "1"}}}, headers=headers)
        assert legacy.status_code == 200 and "mcp-session-id" not in legacy.headers
        assert legacy.json()["result"]["protocolVersion"] == "2025-11-25"
