"""``agentledger principals show|grant|revoke-role|revoke|reinstate``: the principal directory.

Who may approve, request or operate is the directory's answer, read at every console request,
admission and operator command; these commands change it without SQL. Each runs as the
verified operator of the session token (``--token`` or ``AGENTLEDGER_TOKEN``, the console's
tokens), in the session's tenant, and each change is audited (``principal.*`` events) with who
made it and why (:mod:`agentledger.policy.principals`). Changes need the ledger owner's URL
(``AGENTLEDGER_DATABASE_URL``): no service role may write the directory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import asyncpg
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentledger import identity, operators, settings
from agentledger.cli import approvals as cli_approvals
from agentledger.cli import group
from agentledger.ledger import repository as ledger
from agentledger.policy import principals

app = typer.Typer(cls=group.Group, no_args_is_help=True,
                  help="Show and change the principal directory.")
console = Console()
T = TypeVar("T")

Principal = Annotated[str, typer.Argument(help="The principal id, e.g. user:carol")]
Roles = Annotated[list[str], typer.Option("--role", help="A role (repeat for several)")]
Reason = Annotated[str, typer.Option(help="Why (recorded in the audit event)")]


def _as_operator(token: str, act: Callable[[ledger.Conn, identity.Session], Awaitable[T]]
                 ) -> T:
    """Run ``act`` as the verified operator of ``token``, on the owner's connection."""

    async def run() -> T:
        session = operators.verify(token, operators.OperatorSettings())
        conn = await asyncpg.connect(settings.load().database_url)
        try:
            return await act(conn, session)
        finally:
            await conn.close()

    return asyncio.run(run())  # a refusal: one line, from agentledger.cli.group


def _print(entries: list[principals.Entry]) -> None:
    table = Table()
    for column in ("principal", "roles", "revoked at", "updated at"):
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row(Text(e.principal_id), Text(", ".join(e.roles) or "-"),
                      Text(f"{e.revoked_at:%Y-%m-%dT%H:%M:%SZ}" if e.revoked_at else "-"),
                      Text(f"{e.updated_at:%Y-%m-%dT%H:%M:%SZ}"))
    console.print(table)


@app.command()
def show(principal: Annotated[str | None, typer.Argument(help="One principal (default: all)")]
         = None, token: cli_approvals.TokenOpt = "") -> None:
    """Show your tenant's principals, their roles and revocations."""
    found = _as_operator(token, lambda conn, s: principals.show(conn, s, principal))
    if not found:
        console.print("no such principal" if principal else "no principals")
        return
    _print(found)


@app.command()
def grant(principal: Principal, role: Roles, reason: Reason,
          token: cli_approvals.TokenOpt = "") -> None:
    """Grant roles (creates the principal if new; a revoked one stays revoked)."""
    _print([_as_operator(token, lambda conn, s: principals.grant(
        conn, s, principal, role, reason=reason))])


@app.command("revoke-role")
def revoke_role(principal: Principal, role: Roles, reason: Reason,
                token: cli_approvals.TokenOpt = "") -> None:
    """Take roles away: refused what they gave from the next request on."""
    _print([_as_operator(token, lambda conn, s: principals.revoke_role(
        conn, s, principal, role, reason=reason))])


@app.command()
def revoke(principal: Principal, reason: Reason, token: cli_approvals.TokenOpt = "") -> None:
    """Revoke a principal: denied everything from the next request on, queued work included."""
    _print([_as_operator(token, lambda conn, s: principals.revoke(
        conn, s, principal, reason=reason))])


@app.command()
def reinstate(principal: Principal, reason: Reason, token: cli_approvals.TokenOpt = "") -> None:
    """Lift a principal's revocation, with the roles it holds."""
    _print([_as_operator(token, lambda conn, s: principals.reinstate(
        conn, s, principal, reason=reason))])
