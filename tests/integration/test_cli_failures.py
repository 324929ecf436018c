"""Operator commands on a setup that is not ready answer in one line, never a traceback.

Each case runs ``agentledger`` as a person types it (a subprocess, its entry point) against the
real PostgreSQL: a database the migrations never ran on, one that does not exist, a port where
nothing listens. ``--debug`` still shows the traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg2
import pytest

from agentledger import db, settings
from agentledger.cli import context
from agentledger.testing import processes
from tests.stack import Stack

OP = str(uuid.uuid4())


@pytest.fixture(scope="module")
def empty_database(stack: Stack) -> Iterator[str]:
    """A database nobody migrated (the cluster's roles exist: another database was)."""
    name = f"al_empty_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(stack.database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield db.with_database(stack.database_url, name)
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def _cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")},
           "AGENTLEDGER_DATABASE_URL": database_url, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "agentledger.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    said = (done.stdout + done.stderr).strip()
    assert "Traceback" not in said and len(said.splitlines()) == 1, said
    return said


def test_a_database_that_was_never_migrated(empty_database: str) -> None:
    done = _cli(empty_database, "explain", OP, "--tenant", OP)
    said = _one_line(done)
    assert done.returncode == 4
    assert said.startswith("not_migrated: the database ")
    assert f"— apply the migrations: {context.cli_command()} migrate" in said
    listed = _cli(empty_database, "reconcile", "list", "--tenant", OP)
    assert listed.returncode == 4 and _one_line(listed).startswith("not_migrated:")


def test_a_database_that_does_not_exist(stack: Stack) -> None:
    missing = db.with_database(stack.database_url, f"al_missing_{uuid.uuid4().hex[:8]}")
    done = _cli(missing, "migrate")
    assert done.returncode == 4 and _one_line(done).startswith("no_database:")


def test_a_postgres_that_does_not_answer() -> None:
    port = processes.free_port(None)  # nothing listens on a port just found free
    url = f"postgresql://agentledger:agentledger@127.0.0.1:{port}/agentledger"
    done = _cli(url, "reconcile", "list", "--tenant", OP)
    said = _one_line(done)
    assert done.returncode == 3
    assert said.startswith(f"postgres_unreachable: PostgreSQL does not answer at 127.0.0.1:{port}")
    assert "make up" in said


def test_debug_shows_the_traceback(empty_database: str) -> None:
    done = _cli(empty_database, "--debug", "explain", OP, "--tenant", OP)
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr


def test_the_printed_command_line_runs_from_the_checkout() -> None:
    # What the demo and every fix print: `.venv/bin/agentledger` (or where this one lives).
    done = subprocess.run(["bash", "-c", f"{context.cli_command()} --help"],
                          cwd=settings.REPO_ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "explain" in done.stdout, done.stderr
