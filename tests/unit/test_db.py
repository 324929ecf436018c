"""One pool helper: a role name reaches SQL only as a validated identifier."""

from __future__ import annotations

import pytest

from agentledger import db, errors


@pytest.mark.parametrize("role", ["agentledger_admission", "agentledger_auditor", "_r", "a" * 63])
def test_a_plain_role_becomes_one_quoted_set_role(role: str) -> None:
    assert db.set_role_sql(role) == f'SET ROLE "{role}"'


@pytest.mark.parametrize("role", [
    "", 'x"; DROP TABLE agent_command; --', "Admin", "agent-ledger", "a b", "1role", "a" * 64,
    "role\n",
])
def test_anything_else_is_a_configuration_error(role: str) -> None:
    with pytest.raises(errors.ConfigurationError):
        db.role_name(role)


async def test_a_bad_role_fails_before_any_connection_is_made() -> None:
    # The URL points nowhere: reaching it would fail differently (and slowly).
    with pytest.raises(errors.ConfigurationError):
        await db.create_pool("postgresql://nobody@127.0.0.1:1/none", role="bad role", size=1)


async def test_connect_refuses_a_bad_role_before_any_connection_is_made() -> None:
    # The same check as the pool's: the URL points nowhere, so reaching it would fail otherwise.
    with pytest.raises(errors.ConfigurationError):
        await db.connect("postgresql://nobody@127.0.0.1:1/none", role='x"; RESET ROLE; --')


class _RefusingConnection:
    """A connection whose ``SET ROLE`` the server refuses (a role the login is no member of)."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.terminated = False

    async def execute(self, statement: str) -> str:
        self.statements.append(statement)
        raise RuntimeError("permission denied to set role")

    def terminate(self) -> None:
        self.terminated = True


async def test_a_refused_set_role_closes_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller never receives the connection, so connect() is the only one who can close it.
    conn = _RefusingConnection()

    async def fake_connect(url: str) -> _RefusingConnection:
        return conn

    monkeypatch.setattr(db.asyncpg, "connect", fake_connect)
    with pytest.raises(RuntimeError):
        await db.connect("postgresql://ledger/db", role="agentledger_auditor")
    assert conn.statements == ['SET ROLE "agentledger_auditor"'] and conn.terminated


def test_with_database_changes_only_the_database() -> None:
    url = "postgresql://owner:s%40cret@db.example:5433/agentledger?sslmode=require"
    assert (db.with_database(url, "al_test_1")
            == "postgresql://owner:s%40cret@db.example:5433/al_test_1?sslmode=require")
