"""The ``agentledger`` command line: one front door for operators, a thin command per rule.

Each module is one group of commands; every command parses its options, calls the library
and prints the answer. The demo is not here: ``agentledger demo`` finds the repository's
``demo`` package (a checkout) and says so when it is absent.
"""

from __future__ import annotations

import typer

from agentledger.cli import (
    approvals,
    config,
    connector,
    eval,
    explain,
    mcp,
    principals,
    reconcile,
    stack,
)

app = typer.Typer(no_args_is_help=True, help="agentledger: crash-safe AI-agent side effects.")
app.command()(stack.migrate)
app.command()(stack.up)
app.command()(stack.down)
app.command()(stack.status)
app.command()(stack.demo)
app.command("check-config")(config.check_config)
app.add_typer(connector.app, name="connector")
app.add_typer(approvals.app, name="approvals")
app.add_typer(principals.app, name="principals")
app.command("eval")(eval.eval_command)
app.command("mcp")(mcp.mcp)
app.add_typer(reconcile.app, name="reconcile")
app.command("explain")(explain.explain)
app.command("bench")(stack.bench)


def main() -> None:
    app(prog_name="agentledger")


if __name__ == "__main__":
    main()
