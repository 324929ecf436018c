"""A PRIVATE second stack (own Postgres cluster and Kafka broker on free ports, started by
deploy/local/*.sh), for tests that restart the broker or the database: restarting it never
disturbs the tests sharing the main stack.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentledger import migrations, settings

SCRIPTS = settings.REPO_ROOT / "deploy" / "local"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PrivateStack:
    env: dict[str, str]
    database_url: str
    bootstrap: str

    @property
    def kafka_logs(self) -> Path:
        """The private broker's log directory (kept as evidence when a test finds a loss)."""
        return Path(self.env["AGENTLEDGER_LOCAL_DIR"]) / "kafka" / "logs"

    def run(self, service: str, verb: str) -> None:
        subprocess.run(
            ["bash", str(SCRIPTS / f"{service}.sh"), verb],
            env=self.env, check=True, capture_output=True, timeout=120,
        )


@contextmanager
def started() -> Iterator[PrivateStack]:
    """A private Postgres cluster and Kafka broker on free ports, migrated; removed on exit."""
    base = Path(tempfile.mkdtemp(prefix="al-relay-stack-"))
    base.chmod(0o755)  # initdb and postgres run as the `postgres` user when we are root
    (base / "kafka").mkdir()
    (base / "kafka" / "libs").symlink_to(settings.REPO_ROOT / ".local" / "kafka" / "libs")
    pg_port, kafka_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "AGENTLEDGER_LOCAL_DIR": str(base),
        "AGENTLEDGER_PG_PORT": str(pg_port),
        "AGENTLEDGER_KAFKA_PORT": str(kafka_port),
        "AGENTLEDGER_KAFKA_CONTROLLER_PORT": str(_free_port()),
    }
    stack = PrivateStack(
        env,
        f"postgresql://agentledger:agentledger@127.0.0.1:{pg_port}/agentledger",
        f"127.0.0.1:{kafka_port}",
    )
    try:
        starts = [
            subprocess.Popen(["bash", str(SCRIPTS / f"{s}.sh"), "start"], env=env)
            for s in ("postgres", "kafka")
        ]
        assert all(p.wait(timeout=180) == 0 for p in starts)
        asyncio.run(migrations.migrate(stack.database_url, settings.REPO_ROOT / "migrations"))
        yield stack
    finally:
        for service in ("kafka", "postgres"):
            subprocess.run(["bash", str(SCRIPTS / f"{service}.sh"), "stop"], env=env,
                           check=False, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def private_stack() -> Iterator[PrivateStack]:
    with started() as stack:
        yield stack
