"""What a command talks to when the shell says nothing: the checkout's stack and demo.

A fresh shell in a checkout sets no ``AGENTLEDGER_*`` variable, yet a command the demo prints
must work when pasted there (issue 39). Like Flask's command line with its ``.env``,
``agentledger`` then reads, for the variables the environment leaves unset:

1. ``<demo home>/env`` (``.local/demo/env``), written by ``agentledger demo``: the demo's
   ledger, console and operator settings. Read by the operator commands (``explain``,
   ``reconcile``, ``approvals``, ``principals``, …), not by the commands that act on the stack
   itself (:data:`STACK_COMMANDS`), so ``make migrate`` never lands in the demo's database;
2. ``<local dir>/env`` (``.local/env``), written by ``make up``: the stack's connections and
   the ports it was started on.

An environment that names a ledger (``AGENTLEDGER_DATABASE_URL``) is a context of its own — a
deployment, a test, a Makefile target that sourced ``.local/env`` — and then no file is read:
a demo left running in the checkout never mixes its keys or URLs into it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import MutableMapping
from pathlib import Path

import dotenv

from agentledger import settings

# Commands about the stack itself: they read the stack's file only, never the demo's.
STACK_COMMANDS = frozenset({"up", "down", "status", "migrate", "demo", "bench"})
PREFIX = "AGENTLEDGER_"


def files(command: str | None) -> list[Path]:
    """The files ``command`` reads, most specific first (those that exist)."""
    found = [] if command in STACK_COMMANDS else [settings.demo_home() / "env"]
    found.append(settings.local_dir() / "env")
    return [path for path in found if path.is_file()]


def load(command: str | None, environ: MutableMapping[str, str] = os.environ) -> list[Path]:
    """Fill ``environ``'s unset ``AGENTLEDGER_*`` variables from the checkout's files.

    Returns:
        The files read (none when ``environ`` already names a ledger).
    """
    if environ.get("AGENTLEDGER_DATABASE_URL"):
        return []
    read = files(command)
    for path in read:
        for key, value in dotenv.dotenv_values(path).items():
            if key.startswith(PREFIX) and value is not None:
                environ.setdefault(key, value)
    return read


def write(path: Path, values: dict[str, str], *, why: str) -> None:
    """Write ``values`` as an env file both a shell (``. file``) and :func:`load` read, owner
    only (it may hold keys and tokens)."""
    lines = [f"# {why}"]
    for key, value in values.items():
        if "'" in value or "\n" in value:
            raise ValueError(f"{key}: a value with a quote or a newline cannot be written")
        lines.append(f"export {key}='{value}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("\n".join(lines) + "\n")


def cli_command() -> str:
    """How a person in the checkout's root calls this command line, as printed to be pasted:
    ``.venv/bin/agentledger`` for the project's virtualenv (nothing to activate, nothing on
    PATH), else the script's own path, or ``agentledger`` where that is what PATH finds."""
    script = Path(sys.executable).parent / "agentledger"
    if not script.is_file():
        return f"{sys.executable} -m agentledger.cli"
    try:
        return str(script.relative_to(settings.REPO_ROOT))
    except ValueError:
        on_path = shutil.which("agentledger")
        return "agentledger" if on_path and Path(on_path) == script else str(script)
