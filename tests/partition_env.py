"""What the partition cases (test_partitions.py) run on: service addresses that network
namespaces reach, the shared Postgres forwarded onto one of them, a private broker that
advertises another, and the ledger's attempt rows a case reads as evidence."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2

from agentledger import logins, settings
from agentledger.testing import processes
from tests import netns
from tests.tcp_forward import Forwarder

SCRIPTS = settings.REPO_ROOT / "deploy" / "local"


def via(url: str, host: str) -> str:
    """``url`` with its host replaced (the same port: a forwarder keeps it)."""
    parts = urlsplit(url)
    netloc = parts.netloc.replace(f"@{parts.hostname}:", f"@{host}:")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Hub:
    """``pg``: the shared Postgres, forwarded from a service address (route it over a
    namespace's own link to cut Postgres alone); ``svc``: where a private broker and the CRM
    listen for namespaces (their default route)."""

    pg: str
    svc: str


@contextmanager
def hub(database_url: str) -> Iterator[Hub]:
    netns.clean_stale()
    port = urlsplit(database_url).port or 5432
    with netns.ServiceAddress() as pg, netns.ServiceAddress() as svc, \
            Forwarder(pg.ip, port, "127.0.0.1", port):
        yield Hub(pg.ip, svc.ip)


@contextmanager
def private_broker(host: str) -> Iterator[str]:
    """A single-node broker of our own (deploy/local/kafka.sh) that listens on and advertises
    ``host``; yields its bootstrap address."""
    base = Path(tempfile.mkdtemp(prefix="al-partition-kafka-"))
    (base / "kafka").mkdir()
    (base / "kafka" / "libs").symlink_to(settings.REPO_ROOT / ".local" / "kafka" / "libs")
    port = processes.free_port()
    env = {**os.environ, "AGENTLEDGER_LOCAL_DIR": str(base),
           "AGENTLEDGER_KAFKA_HOST": host, "AGENTLEDGER_KAFKA_PORT": str(port),
           "AGENTLEDGER_KAFKA_CONTROLLER_PORT": str(processes.free_port()),
           "AGENTLEDGER_KAFKA_BROKERS": "1"}
    try:
        subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), "start"], env=env, check=True,
                       capture_output=True, timeout=180)
        yield f"{host}:{port}"
    finally:
        subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), "stop"], env=env, check=False,
                       capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def login_url(database_url: str, service: str, host: str) -> str:
    """``service``'s own login (its role, as the pipeline gives it), reached at ``host``."""
    return via(asyncio.run(logins.ensure(database_url))[service], host)


def attempts(database_url: str, op: uuid.UUID) -> list[dict[str, Any]]:
    """The command's attempt rows, oldest first."""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT fencing_generation, worker_id, kind, result, detail, sent_at, "
                        "finished_at FROM command_attempt WHERE operation_id = %s "
                        "ORDER BY started_at, fencing_generation", (str(op),))
            cols = [c.name for c in cur.description or ()]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    finally:
        conn.close()


def command(database_url: str, op: uuid.UUID) -> dict[str, Any]:
    """State, generation and reason of one command."""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT state, fencing_generation, outcome_reason, provider_receipt "
                        "FROM agent_command WHERE operation_id = %s", (str(op),))
            row = cur.fetchone()
            cols = [c.name for c in cur.description or ()]
    finally:
        conn.close()
    return dict(zip(cols, row, strict=True)) if row else {}


def crm_effects(crm_database_url: str, op: uuid.UUID) -> int:
    """Effects the CRM applied under the command's key, read from its own database (the CRM's
    HTTP API may be behind a cut link)."""
    conn = psycopg2.connect(crm_database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM crm_effect WHERE idempotency_key = %s", (str(op),))
            row = cur.fetchone()
    finally:
        conn.close()
    return int(row[0]) if row else 0


def log_since(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")
