"""A Kafka Connect worker (standalone mode) as a subprocess, with the Debezium plugin.

The jars come from Maven Central through deploy/connect/fetch.sh into .local/connect; the
worker runs with the machine's Java against whatever Kafka the tests use.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentledger.testing.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "deploy" / "connect" / "fetch.sh"
LOG4J = ROOT / "deploy" / "connect" / "log4j2.xml"
# The worker shares a 2-core box with Kafka, Postgres and the tests; 512 MiB is plenty for
# one connector with a handful of records in flight.
HEAP = "-Xmx512m"


def fetch(home: Path) -> Path:
    """Fetch (first run) or reuse the Connect + Debezium jars; returns the cache directory."""
    env = {**os.environ, "CONNECT_HOME": str(home)}
    out = subprocess.run(["bash", str(FETCH)], env=env, check=True, capture_output=True,
                         text=True, timeout=1200)
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Worker:
    """One standalone worker: offsets in a file, REST on a free loopback port."""

    home: Path
    bootstrap: str
    workdir: Path
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "connect.log"

    def start(self, connector: dict[str, Any]) -> None:
        """Start the worker with ``connector`` (``{"name":…, "config":…}``) configured."""
        props = {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.storage.file.filename": str(self.workdir / "offsets"),
            # Flushed offsets are what a restarted worker resumes from; 1 s keeps the test's
            # stop/start honest without a flush storm.
            "offset.flush.interval.ms": "1000",
            "plugin.path": str(self.home / "plugins"),
            # Debezium ships ServiceLoader manifests: no reflective scan of every jar.
            "plugin.discovery": "service_load",
            "listeners": self.url,
        }
        worker = self.workdir / "worker.properties"
        worker.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        spec = self.workdir / "connector.json"
        spec.write_text(json.dumps(connector, indent=2))
        java = shutil.which("java")
        assert java, "java is missing (make bootstrap installs it)"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [java, HEAP, f"-Dlog4j2.configurationFile={LOG4J}",
                 "-cp", str(self.home / "worker" / "*"),
                 "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(spec)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{self.url}/connectors/{name}/status", timeout=2)
        except httpx.HTTPError:
            return None  # not listening yet
        return dict(response.json()) if response.status_code == 200 else None

    def wait_running(self, name: str, timeout: float) -> dict[str, Any]:
        """Poll the REST API until the connector and its task run; fail on FAILED or exit."""
        seen: dict[str, Any] = {}

        def running() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (
                f"Connect exited {self.proc and self.proc.returncode}:\n{self.log_tail()}")
            status = self.status(name)
            if status is None:
                return False
            seen.update(status)
            states = [status["connector"]["state"], *(t["state"] for t in status["tasks"])]
            assert "FAILED" not in states, f"{json.dumps(status)[:3000]}\n{self.log_tail()}"
            return len(states) > 1 and set(states) == {"RUNNING"}

        assert wait_until(running, timeout=timeout, interval=0.25), (
            f"connector not running: {seen}\n{self.log_tail()}")
        return seen

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (the worker commits offsets and closes the slot stream), SIGKILL if stuck."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


def elapsed(start: float) -> str:
    return f"{time.monotonic() - start:.1f}s"
