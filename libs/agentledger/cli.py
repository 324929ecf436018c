"""The ``agentledger`` command line: one front door for operators."""

from __future__ import annotations

import asyncio
import subprocess

import typer
from rich.console import Console

from agentledger import migrations, settings

app = typer.Typer(no_args_is_help=True, help="agentledger: crash-safe AI-agent side effects.")
console = Console()
_STACK = settings.REPO_ROOT / "deploy" / "local" / "stack.sh"


@app.command()
def migrate() -> None:
    """Apply pending database migrations."""
    cfg = settings.load()
    done = asyncio.run(migrations.migrate(cfg.database_url, cfg.migrations_dir))
    for m in done:
        console.print(f"applied [bold]{m.path.name}[/bold]")
    versions = asyncio.run(migrations.applied_versions(cfg.database_url))
    current = versions[-1][0] if versions else 0
    console.print(f"schema at version {current} ({len(done)} applied now)")


def _stack(verb: str) -> None:
    rc = subprocess.call(["bash", str(_STACK), verb])  # noqa: S603,S607 - our own script
    if rc:
        raise typer.Exit(rc)


@app.command()
def up() -> None:
    """Start Kafka and PostgreSQL as local processes (no Docker needed)."""
    _stack("up")


@app.command()
def down() -> None:
    """Stop the local Kafka and PostgreSQL."""
    _stack("down")


@app.command()
def status() -> None:
    """Show whether the local Kafka and PostgreSQL answer."""
    _stack("status")


def main() -> None:
    app(prog_name="agentledger")


if __name__ == "__main__":
    main()
