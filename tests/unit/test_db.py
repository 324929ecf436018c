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
