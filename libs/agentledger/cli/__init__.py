"""The ``agentledger`` command line: one front door for operators, a thin command per rule.

Each module is one group of commands; every command parses its options, calls the library
and prints the answer. What they share is in :mod:`agentledger.cli.group` (expected failures
as one line, ``--debug`` for a traceback) and :mod:`agentledger.cli.context` (what a command
talks to when the shell sets nothing: the checkout's stack and demo). The demo is not here:
``agentledger demo`` finds the repository's ``demo`` package (a checkout) and says so when it
is absent.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from agentledger.cli import (
    approvals,
    config,
    connector,
    context,
    eval,
    evidence,
    explain,
    group,
    mcp,
    principals,
    reconcile,
    stack,
)
from agentledger.kafka import logs as kafka_logs

# A failure nobody expected is a bug: its plain traceback, not a screenful of framed source.
app = typer.Typer(cls=group.Group, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="agentledger: crash-safe AI-agent side effects.")


@app.callback()
def _root(debug: Annotated[bool, typer.Option(
        "--debug", envvar="AGENTLEDGER_DEBUG",
        help="Show the traceback of a failure instead of its one-line account")] = False,
          ) -> None:
    """agentledger: crash-safe AI-agent side effects."""


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
app.add_typer(evidence.app, name="evidence")
app.command("bench")(stack.bench)


def _command(argv: list[str]) -> str | None:
    """The command named on the line (the first word that is not a root option)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main() -> None:
    """The ``agentledger`` script: the checkout's context, then the command."""
    argv = sys.argv[1:]
    command = _command(argv)
    debug = "--debug" in (argv[: argv.index(command)] if command else argv)
    context.load(command)
    if debug:
        logging.basicConfig(level=logging.DEBUG)
    else:
        # librdkafka's lines (a broker that does not answer, a client torn down) stay off the
        # terminal: what matters reaches the command as an error it reports in one line.
        kafka_logs.LIBRDKAFKA.propagate = False
        kafka_logs.LIBRDKAFKA.addHandler(logging.NullHandler())
    app(prog_name="agentledger")


if __name__ == "__main__":
    main()
