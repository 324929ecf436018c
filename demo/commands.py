"""The commands the demo prints for a person to type, what they need, and running them as typed.

Every command the demo prints is alone on a line that starts with ``$ `` (tests/e2e/test_demo.py
collects those lines and runs each in a fresh shell), written as it works when pasted into a
fresh shell at the checkout's root: the project's ``.venv/bin/agentledger`` (nothing to
activate, nothing on PATH), and in front of it only what a non-default checkout-local
directory or demo home needs. Everything else such a command needs, the demo writes:

- ``<home>/env``: the demo's ledger, console and operator settings, which ``agentledger``
  reads for what the shell leaves unset (:mod:`agentledger.cli.context`);
- ``<home>/tokens/<name>``: each principal's session token (owner only), for
  ``AGENTLEDGER_TOKEN=$(cat …)``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from agentledger import settings
from agentledger.cli import context
from demo import stack

# One CLI command (Python start-up, a query or two) takes a second or two; a minute is stuck.
RUN_TIMEOUT_S = 60.0


def shown(path: Path) -> str:
    """``path`` as typed at the checkout's root: relative inside it, absolute outside."""
    try:
        return str(path.resolve().relative_to(settings.REPO_ROOT))
    except ValueError:
        return str(path)


def prefix(home: Path) -> str:
    """The variables a pasted command needs set in front of it: none for the checkout's own
    ``.local`` and the demo's default home."""
    needs = []
    local = settings.local_dir()
    if local.resolve() != (settings.REPO_ROOT / ".local").resolve():
        needs.append(f"AGENTLEDGER_LOCAL_DIR={shlex.quote(str(local))}")
    if home.resolve() != (local / "demo").resolve():
        needs.append(f"AGENTLEDGER_DEMO_HOME={shlex.quote(str(home))}")
    return "".join(f"{n} " for n in needs)


def cli(home: Path, *args: str) -> str:
    """``agentledger <args>`` as printed for this demo."""
    return prefix(home) + " ".join([context.cli_command(), *args])


def make(home: Path, target: str) -> str:
    """``make <target>`` as printed for this demo."""
    return f"{prefix(home)}make {target}"


def token_file(home: Path, principal: str) -> Path:
    """Where the demo keeps ``principal``'s session token (``user:bob`` → ``tokens/bob``)."""
    return home / "tokens" / principal.split(":", 1)[-1]


def with_token(home: Path, principal: str, command: str) -> str:
    """``command`` signed with ``principal``'s session token, read from its file."""
    return f"AGENTLEDGER_TOKEN=$(cat {shlex.quote(shown(token_file(home, principal)))}) {command}"


def show(console: Console, line: str) -> None:
    """Print ``line`` as a command to type: alone, never wrapped (a terminal wraps it)."""
    console.print(f"  [bold]$[/bold] {escape(line)}", soft_wrap=True, highlight=False)


def run(console: Console, line: str) -> str:
    """Print ``line``, run it as a person would paste it and return what it printed.

    It runs in a fresh shell at the checkout's root: the demo's ``AGENTLEDGER_*`` variables
    are not passed, so what works here works when typed.

    Raises:
        stack.DemoError: The command failed (its output is in the message).
    """
    show(console, line)
    fresh = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "USER")
             if name in os.environ}
    fresh["COLUMNS"] = str(console.width)
    done = subprocess.run(["bash", "-c", line], cwd=settings.REPO_ROOT, env=fresh,  # noqa: S603,S607
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise stack.DemoError(f"`{line}` failed (exit {done.returncode}): "
                              f"{(done.stdout + done.stderr).strip()}",
                              "read the service logs; `make status` shows what runs")
    return done.stdout


def write(home: Path, values: dict[str, str], tokens: dict[str, str]) -> None:
    """The files the printed commands need: ``<home>/env`` and the token files."""
    context.write(home / "env", values, why="Written by `agentledger demo`: the settings its "
                  "printed commands need (agentledger reads them for what the shell leaves "
                  "unset; `. this-file` sets them in a shell).")
    for principal, token in tokens.items():
        path = token_file(home, principal)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(token + "\n")
