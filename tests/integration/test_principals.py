"""`agentledger principals`: the principal directory changed by an operator, audited, seen at once.

Revoking or changing a principal's roles needed SQL and left no trace (issue 18 §3). Now it is
an operator command run with a verified operator session; each change writes a `principal.*`
audit event, and the next console request (or operator command) sees it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
from click.testing import Result
from fastapi import FastAPI
from typer.testing import CliRunner

from agentledger import cli
from agentledger.services.console import app as console_app
from agentledger.services.console.settings import ConsoleSettings
from agentledger.testing import identities

OPERATOR = identities.OPERATOR


async def principals(database_url: str, token: str, *args: str) -> Result:
    """`agentledger principals …` as an operator's shell runs it (its own event loop: a thread)."""
    env = {**identities.operator_env(database_url), "AGENTLEDGER_TOKEN": token}
    return await asyncio.to_thread(CliRunner().invoke, cli.app, ["principals", *args], env=env)


async def audit(db: asyncpg.Connection, tenant: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    rows = await db.fetch("SELECT type, payload FROM audit_event WHERE tenant_id = $1 "
                          "AND type LIKE 'principal.%' ORDER BY seq", tenant)
    return [(r["type"], json.loads(r["payload"])) for r in rows]


class Console:
    """The approvals console in this process, on this test's database, as approvers call it."""

    def __init__(self, database_url: str) -> None:
        self.app: FastAPI = console_app.create_app(ConsoleSettings.model_validate({
            "AGENTLEDGER_DATABASE_URL": database_url,
            "AGENTLEDGER_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
            "session_keys": identities.SESSION_KEYS, "session_issuer": identities.SESSION_ISSUER,
            "session_audience": identities.SESSION_AUDIENCE, "cookie_secure": False}))

    async def status(self, token: str) -> int:
        """The status of the console's next request listing approvals with ``token``."""
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            response = await client.get("/api/v1/approvals",
                                        headers={"Authorization": f"Bearer {token}"})
        return response.status_code


@contextlib.asynccontextmanager
async def running_console(database_url: str) -> AsyncIterator[Console]:
    console = Console(database_url)
    async with console.app.router.lifespan_context(console.app):
        yield console


async def test_granting_and_revoking_a_role_changes_the_next_console_request_and_is_audited(
    database_url: str, db: asyncpg.Connection,
) -> None:
    tenant = uuid.uuid4()
    await identities.put_principals(database_url, tenant, {OPERATOR: ["agent-operator"]})
    carol = identities.session_token(tenant, "user:carol", ["approver"])  # what the IdP claims
    operator = identities.session_token(tenant, OPERATOR)
    async with running_console(database_url) as console:
        assert await console.status(carol) == 403  # the directory decides: carol is unknown here

        granted = await principals(database_url, operator, "grant", "user:carol", "--role", "approver",
                                   "--reason", "joins the review rota")
        assert granted.exit_code == 0, granted.output
        assert await console.status(carol) == 200

        taken = await principals(database_url, operator, "revoke-role", "user:carol", "--role", "approver",
                                 "--reason", "left the review rota")
        assert taken.exit_code == 0, taken.output
        assert await console.status(carol) == 403

        regranted = await principals(database_url, operator, "grant", "user:carol", "--role", "approver",
                                     "--reason", "back on the rota")
        assert regranted.exit_code == 0 and await console.status(carol) == 200, regranted.output
        revoked = await principals(database_url, operator, "revoke", "user:carol", "--reason", "left")
        assert revoked.exit_code == 0 and await console.status(carol) == 403, revoked.output

    events = await audit(db, tenant)
    assert [t for t, _ in events] == ["principal.role_granted", "principal.role_revoked",
                                      "principal.role_granted", "principal.revoked"]
    first, second = events[0][1], events[1][1]
    assert (first["principal_id"], first["by"], first["reason"]) == ("user:carol", OPERATOR, "joins the review rota")
    assert (first["created"], first["roles_before"], first["roles_after"]) == (True, [], ["approver"])
    assert (second["roles_before"], second["roles_after"], second["reason"]) == (["approver"], [], "left the review rota")
    assert (events[3][1]["revoked_before"], events[3][1]["revoked_after"]) == (False, True)
    row = await db.fetchrow("SELECT roles, revoked_at FROM principal WHERE tenant_id = $1 AND principal_id = $2",
                            tenant, "user:carol")
    assert json.loads(row["roles"]) == ["approver"] and row["revoked_at"] is not None


async def test_taking_an_operators_role_stops_their_next_operator_command(
    database_url: str, db: asyncpg.Connection,
) -> None:
    tenant = uuid.uuid4()
    await identities.put_principals(database_url, tenant, {OPERATOR: ["agent-operator"],
                                                           "ops:oscar": ["agent-operator"]})
    operator = identities.session_token(tenant, OPERATOR)
    oscar = identities.session_token(tenant, "ops:oscar")
    shown = await principals(database_url, oscar, "show")
    assert shown.exit_code == 0 and OPERATOR in shown.output, shown.output

    taken = await principals(database_url, operator, "revoke-role", "ops:oscar", "--role", "agent-operator",
                             "--reason", "moved to another team")
    assert taken.exit_code == 0, taken.output
    refused = await principals(database_url, oscar, "show")
    assert refused.exit_code == 2 and "not_an_operator" in refused.output, refused.output
    # His unexpired token cannot put himself back, nor act on anyone else.
    again = await principals(database_url, oscar, "grant", "user:mallory", "--role", "approver",
                             "--reason", "a friend")
    assert again.exit_code == 2 and "not_an_operator" in again.output, again.output
    assert await db.fetchval("SELECT count(*) FROM principal WHERE tenant_id = $1 AND principal_id = $2",
                             tenant, "user:mallory") == 0

    back = await principals(database_url, operator, "grant", "ops:oscar", "--role", "agent-operator",
                            "--reason", "back from the other team")
    assert back.exit_code == 0, back.output
    assert (await principals(database_url, oscar, "show", "ops:oscar")).exit_code == 0
    assert [t for t, _ in await audit(db, tenant)] == ["principal.role_revoked", "principal.role_granted"]


async def test_refused_changes_change_nothing_and_leave_no_audit_event(
    database_url: str, db: asyncpg.Connection,
) -> None:
    tenant = uuid.uuid4()
    await identities.put_principals(database_url, tenant, {OPERATOR: ["agent-operator"],
                                                           "user:bob": ["approver"]})
    operator = identities.session_token(tenant, OPERATOR)
    cases = {
        # An operator never changes their own entry: another operator does.
        "self": (operator, ["grant", OPERATOR, "--role", "approver", "--reason", "handy"], "policy_denied"),
        # An approver whose token claims the operating role, which the directory does not give.
        "not an operator": (identities.session_token(tenant, "user:bob"),
                            ["grant", "user:carol", "--role", "approver", "--reason", "x"], "not_an_operator"),
        "another tenant's operator": (identities.session_token(uuid.uuid4(), OPERATOR),
                                      ["revoke", "user:bob", "--reason", "x"], "not_an_operator"),
        "a forged token": (identities.session_token(tenant, OPERATOR,
                                                    private_pem=identities.identity.generate_keypair()[0]),
                           ["revoke", "user:bob", "--reason", "x"], "identity_rejected"),
        "no such principal": (operator, ["revoke-role", "user:nobody", "--role", "approver", "--reason", "x"],
                              "principal_not_found"),
        "not a role name": (operator, ["grant", "user:bob", "--role", "approver; drop", "--reason", "x"],
                            "validation_failed"),
    }
    for name, (token, args, code) in cases.items():
        done = await principals(database_url, token, *args)
        assert done.exit_code == 2 and code in done.output, (name, done.output)
    rows = await db.fetch("SELECT principal_id, roles, revoked_at FROM principal WHERE tenant_id = $1 "
                          "ORDER BY principal_id", tenant)
    assert [(r["principal_id"], json.loads(r["roles"]), r["revoked_at"]) for r in rows] == [
        (OPERATOR, ["agent-operator"], None), ("user:bob", ["approver"], None)]
    assert await audit(db, tenant) == []
