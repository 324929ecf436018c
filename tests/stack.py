"""Choose the Kafka broker and PostgreSQL server the tests talk to.

Order: URLs given in the environment → testcontainers when a Docker engine answers → the
local processes of deploy/local (started if needed, stopped at the end if we started them).
Whatever is chosen is real Apache Kafka and real PostgreSQL; nothing is faked.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:15"


@dataclass(frozen=True)
class Stack:
    database_url: str
    kafka_bootstrap: str
    source: str  # "env", "docker" or "local"


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False  # no engine to ask; docker-py would leave a socket behind asking anyway
    try:
        import docker  # testcontainers' dependency

        client = docker.from_env(timeout=3)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _docker_stack() -> Iterator[Stack]:
    # Only reached where a Docker engine answers; same images and settings as docker-compose.yml.
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs
    from testcontainers.postgres import PostgresContainer

    kport = _free_port()
    kafka = (
        DockerContainer(KAFKA_IMAGE)
        .with_bind_ports(9092, kport)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{kport}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    )
    postgres = PostgresContainer(
        POSTGRES_IMAGE, username="agentledger", password="agentledger", dbname="agentledger"
    ).with_command("postgres -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 -c max_connections=300")
    with kafka, postgres:
        wait_for_logs(kafka, "Kafka Server started", timeout=120)
        url = postgres.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
        yield Stack(url, f"127.0.0.1:{kport}", "docker")


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            values[key] = value
    return values


@contextmanager
def _local_stack() -> Iterator[Stack]:
    script = ROOT / "deploy" / "local" / "stack.sh"
    already = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if not already:
        subprocess.run(["bash", str(script), "up"], check=True)
    env = _read_env_file(ROOT / ".local" / "env")
    try:
        yield Stack(env["AGENTLEDGER_DATABASE_URL"], env["AGENTLEDGER_KAFKA_BOOTSTRAP"], "local")
    finally:
        if not already:
            subprocess.run(["bash", str(script), "down"], check=False)


@contextmanager
def choose() -> Iterator[Stack]:
    db, kafka = os.environ.get("AGENTLEDGER_DATABASE_URL"), os.environ.get("AGENTLEDGER_KAFKA_BOOTSTRAP")
    if db and kafka:
        yield Stack(db, kafka, "env")
    elif _docker_answers():
        with _docker_stack() as stack:
            yield stack
    else:
        with _local_stack() as stack:
            yield stack
