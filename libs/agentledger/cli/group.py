"""The command line's click group: what every command shares, in one place.

- Expected failures (:mod:`agentledger.cli.failures`) end as one line and an exit code;
  ``agentledger --debug …`` shows the traceback instead.
- A flag takes no value, so its help shows none: Typer's help panels print every option's
  type, ``--json <bool>`` included, which reads as if the flag wanted one.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from agentledger.cli import failures

console = Console()


def _untyped_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # what the help prints in the type column
    return params


class Group(TyperGroup):
    """The root group and every sub-group (``approvals``, ``reconcile``, …)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is not None and not isinstance(found, Group):
            _untyped_flags(found.get_params(ctx))
        return found

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):  # usage, --help
            raise
        except Exception as exc:
            if ctx.find_root().params.get("debug"):
                raise
            failure = failures.classify(exc)
            if failure is None:
                raise
            console.print(f"[red]{escape(failure.code)}[/red]: {escape(failure.cause)}"
                          + (f" — [yellow]{escape(failure.fix)}[/yellow]" if failure.fix
                             else ""), highlight=False, soft_wrap=True)
            raise typer.Exit(failure.exit_code) from exc
