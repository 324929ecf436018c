"""The local stack and the repository's programs: migrate, up, down, status, demo, bench.

The demo and the benchmark live in the repository (top-level ``demo`` and ``bench``), not in
the library: these commands find them in a checkout and say what to do when they are absent.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.console import Console

from agentledger import migrations, settings

console = Console()
_STACK = settings.REPO_ROOT / "deploy" / "local" / "stack.sh"
_NO_CHECKOUT = 2  # the exit code of a command that needs the repository's checkout


def migrate() -> None:
    """Apply pending database migrations."""
    cfg = settings.load()
    done = asyncio.run(migrations.migrate(cfg.database_url, cfg.migrations_dir))
    for m in done:
        console.print(f"applied [bold]{m.path.name}[/bold]")
    versions = asyncio.run(migrations.applied_versions(cfg.database_url))
    current = versions[-1][0] if versions else 0
    where = urlsplit(cfg.database_url)
    console.print(f"schema at version {current} ({len(done)} applied now) in "
                  f"{where.hostname}:{where.port}{where.path}", highlight=False)


def _stack(verb: str) -> None:
    rc = subprocess.call(["bash", str(_STACK), verb])  # noqa: S603,S607 - our own script
    if rc:
        raise typer.Exit(rc)


def _demo_module(name: str) -> ModuleType | None:
    """``demo.<name>`` from the checkout, or None where agentledger is installed without one.

    The repository root goes on the path only when it holds the demo: the demo is a program
    of the checkout (like ``bench``), never part of the installed library."""
    root = str(settings.REPO_ROOT)
    if (settings.REPO_ROOT / "demo" / "__init__.py").exists() and root not in sys.path:
        sys.path.append(root)
    try:
        return importlib.import_module(f"demo.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("demo", f"demo.{name}"):
            raise
        return None


def up() -> None:
    """Start Kafka and PostgreSQL as local processes (no Docker needed)."""
    _stack("up")


def down() -> None:
    """Stop the demo's services (if any), then the local Kafka and PostgreSQL."""
    demo_stack = _demo_module("stack")
    stopped = demo_stack.stop_all(settings.demo_home()) if demo_stack else []
    if stopped:
        console.print(f"stopped the demo's services: {', '.join(stopped)}")
    _stack("down")


def status() -> None:
    """Show the demo's services, and whether the local Kafka and PostgreSQL answer."""
    demo_stack = _demo_module("stack")
    for name, pid, alive in demo_stack.running(settings.demo_home()) if demo_stack else []:
        console.print(f"demo {name:<17} pid {pid:<8} {'running' if alive else '[red]gone[/red]'}")
    _stack("status")


def demo(
    browser_hints: Annotated[bool, typer.Option(
        "--browser-hints/--no-browser-hints",
        help="Leave a refund pending and print the console sign-in")] = True,
    database: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_DEMO_DATABASE", help="Demo ledger database (recreated)")
    ] = "agentledger_demo",
    namespace: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_DEMO_NAMESPACE", help="Topic prefix of the demo")] = "demo",
    home: Annotated[Path | None, typer.Option(
        envvar="AGENTLEDGER_DEMO_HOME", show_default=False,
        help="Logs, pid files, keys, state and the env of its commands [default: .local/demo]")
    ] = None,
) -> None:
    """Start every service as a real process and play eight narrated scenarios."""
    run = _demo_module("run")
    if run is None:
        console.print("[red]the demo is not here[/red]: it lives in the repository's demo/ "
                      "package; run this from a checkout of agentledger (`make demo`)")
        raise typer.Exit(_NO_CHECKOUT)
    run.main(browser_hints=browser_hints, database=database, namespace=namespace,
             home=home or settings.demo_home(), console=console)


def bench() -> None:
    """Run the benchmark (the repository's bench/ package) and write bench/results/latest.*."""
    if not (settings.REPO_ROOT / "bench" / "__main__.py").exists():
        console.print("[red]bench/ is not here[/red]: run this from a checkout of agentledger")
        raise typer.Exit(_NO_CHECKOUT)
    rc = subprocess.call([sys.executable, "-m", "bench"], cwd=settings.REPO_ROOT)
    raise typer.Exit(rc)
