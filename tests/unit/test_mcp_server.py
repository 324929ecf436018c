"""The MCP server's wiring, in process: who is listed what, and who is refused."""

from __future__ import annotations

import json
import uuid

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from agentledger import identity
from agentledger.mcp import auth, server
from agentledger.mcp.settings import McpSettings

PRIVATE, PUBLIC = identity.generate_keypair("EdDSA")
OTHER, _ = identity.generate_keypair("EdDSA")
ISS, AUD, KID = "https://idp.example", "agentledger-ingress", "idp-1"
TENANT = uuid.uuid4()


def token(roles: list[str], private: str = PRIVATE) -> str:
    return identity.issue_session(private, KID, tenant_id=TENANT, subject="user:alice",
                                  audience=AUD, issuer=ISS, roles=roles)


def settings(stdio_token: str | None) -> McpSettings:
    return McpSettings.model_validate({
        "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:9", "session_keys": {KID: PUBLIC},
        "session_issuer": ISS, "session_audience": AUD, "token": stdio_token})


class Headers:
    def __init__(self, authorization: str | None) -> None:
        self.headers = {"authorization": authorization} if authorization else {}


AUTHENTICATOR = auth.Authenticator(identity.KeySet.from_pem({KID: PUBLIC}), ISS, AUD)


def test_a_bearer_header_is_verified_like_ingress_does() -> None:
    caller = AUTHENTICATOR.caller(Headers(f"Bearer {token(['user'])}"))
    assert (caller.session.tenant_id, caller.session.principal_id, caller.session.roles) == (
        TENANT, "user:alice", ("user",))


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", f"Bearer {token(['user'], OTHER)}",
                                    "Bearer not-a-jwt"])
def test_a_missing_or_invalid_token_is_an_mcp_error(header: str | None) -> None:
    with pytest.raises(MCPError) as caught:
        AUTHENTICATOR.caller(Headers(header))
    assert caught.value.code == auth.UNAUTHENTICATED
    assert caught.value.message == "the session token is missing or invalid"


def test_stdio_uses_the_configured_token_and_refuses_without_one() -> None:
    configured = auth.Authenticator(AUTHENTICATOR.keys, ISS, AUD, token(["user"]))
    assert configured.caller(None).session.principal_id == "user:alice"
    with pytest.raises(MCPError):
        AUTHENTICATOR.caller(None)


async def test_in_process_listing_follows_the_configured_token() -> None:
    async with Client(server.build(settings(token(["user"])))) as mcp:
        names = [t.name for t in (await mcp.list_tools()).tools]
    assert {"billing.refund.create", "crm.contact.update", "crm.note.create"} <= set(names)
    assert names[-1] == "agentledger_status"
    async with Client(server.build(settings(token([])))) as mcp:
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
        async with Client(server.build(settings(token(["user"], OTHER)))) as mcp:
            await mcp.list_tools()
    found = _mcp_error(caught.value)
    assert found is not None and found.code == auth.UNAUTHENTICATED


async def test_in_process_an_unlisted_tool_is_an_mcp_error_before_anything_is_sent() -> None:
    # The bootstrap and ingress are unreachable: an attempt to send would not end this way.
    with pytest.raises(BaseException) as caught:
        async with Client(server.build(settings(token([])))) as mcp:
            await mcp.call_tool("crm.note.create", {"customer_id": "c", "body": "b", "target": "c"})
    found = _mcp_error(caught.value)
    assert found is not None and found.message == "no tool named 'crm.note.create' for this caller"


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_BOOTSTRAP", "k:1")
    monkeypatch.setenv("AGENTLEDGER_MCP_SESSION_KEYS", json.dumps({KID: PUBLIC}))
    monkeypatch.setenv("AGENTLEDGER_MCP_SESSION_ISSUER", ISS)
    monkeypatch.setenv("AGENTLEDGER_MCP_WAIT_S", "5")
    monkeypatch.setenv("AGENTLEDGER_MCP_TOKEN", "t")
    found = McpSettings.model_validate({"transport": "http"})
    assert (found.kafka_bootstrap, found.wait_s, found.transport, found.port) == ("k:1", 5.0, "http", 8060)
    assert found.token is not None and found.token.get_secret_value() == "t"
