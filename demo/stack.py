"""The demo's world around its processes: the shared stack, a fresh database and namespace.

The services themselves are detached processes with pid files under the demo's home
(``settings.demo_home()``, :mod:`agentledger.testing.processes`): they outlive the
``agentledger demo`` command, and ``agentledger down`` stops exactly the pids recorded there
through :func:`stop_all`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg2  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from agentledger import db, settings
from agentledger.cli import context
from agentledger.kafka import logs
from agentledger.testing import processes

STACK_SCRIPT = settings.REPO_ROOT / "deploy" / "local" / "stack.sh"
# Probes of a stack that is up answer in milliseconds; a down one must not hang the check.
PROBE_TIMEOUT_S = 3.0


class DemoError(processes.StartFailed):
    """A step of the demo failed; ``fix`` is what to try."""


# --- the shared stack ------------------------------------------------------------------------


def postgres_answers(url: str) -> bool:
    try:
        psycopg2.connect(url, connect_timeout=int(PROBE_TIMEOUT_S)).close()
    except psycopg2.Error:
        return False
    return True


def kafka_answers(bootstrap: str) -> bool:
    try:
        AdminClient({"bootstrap.servers": bootstrap}, logger=logs.LIBRDKAFKA).list_topics(
            timeout=PROBE_TIMEOUT_S)
    except Exception:
        return False
    return True


def stack_answers(database_url: str, bootstrap: str) -> bool:
    return postgres_answers(database_url) and kafka_answers(bootstrap)


def ensure_stack(home: Path) -> None:
    """Start Kafka and PostgreSQL with ``deploy/local/stack.sh up`` (its output in
    ``home/logs/stack-up.log``), then read the connections it wrote (``.local/env``)."""
    log = home / "logs" / "stack-up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        rc = subprocess.call(["bash", str(STACK_SCRIPT), "up"],  # noqa: S603,S607 - our script
                             stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise DemoError(f"deploy/local/stack.sh up failed (exit {rc}); its output is in {log}",
                        "run `make bootstrap` once (installs Java, Maven, PostgreSQL), then "
                        "`make up` to see the error")
    context.load("demo")


def recreate_database(owner_url: str, name: str) -> str:
    """Drop ``name`` (and the replication slots on it) and create it empty; returns its URL."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise DemoError(f"database name {name!r} is not a plain lower-case identifier",
                        "use letters, digits and _ only")
    conn = psycopg2.connect(owner_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,))
            for (slot,) in cur.fetchall():
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return db.with_database(owner_url, name)


def delete_topics(bootstrap: str, prefix: str) -> int:
    """Delete the topics of earlier demo runs (everything under ``prefix``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=logs.LIBRDKAFKA)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    for future in (admin.delete_topics(names, operation_timeout=30).values() if names else []):
        future.result(timeout=30)
    return len(names)


def running(home: Path) -> list[tuple[str, int, bool]]:
    """(name, pid, alive) of every demo service with a pid file under ``home``."""
    return processes.recorded(home)


def stop_all(home: Path) -> list[str]:
    """Stop the demo's services recorded under ``home``; the names of those that ran."""
    return processes.stop_all(home)
