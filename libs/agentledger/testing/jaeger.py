"""A real Jaeger (v2: in-memory storage, OTLP in, query API and UI out) on free ports, for
the tests and the demo to send the services' spans to and read them back.

The binary and its UI are installed by ``deploy/local/jaeger.sh install`` (``make test`` runs it);
the configuration is ``deploy/local/jaeger.yaml``, its ports given through the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentledger import settings
from agentledger.testing.polling import wait_until
from agentledger.testing.processes import free_ports, terminate

CONFIG = settings.REPO_ROOT / "deploy" / "local" / "jaeger.yaml"
START_TIMEOUT_S = 60.0
INSTALL = "make test installs it (bash deploy/local/bootstrap.sh test)"


def _local() -> Path:
    return Path(os.environ.get("AGENTLEDGER_LOCAL_DIR") or settings.REPO_ROOT / ".local")


def binary() -> Path:
    """Built by ``deploy/local/jaeger.sh install``."""
    found = Path(os.environ.get("AGENTLEDGER_JAEGER_BIN") or _local() / "bin" / "jaeger")
    assert found.is_file(), f"{found} is missing: {INSTALL}"
    return found


def ui_assets() -> Path:
    """The UI's files, unpacked by ``deploy/local/jaeger.sh install``."""
    found = Path(os.environ.get("AGENTLEDGER_JAEGER_UI_ASSETS") or _local() / "jaeger-ui")
    assert (found / "index.html").is_file(), (
        f"{found}/index.html is missing: {INSTALL}")
    return found


@dataclass(frozen=True)
class Jaeger:
    """Where one running Jaeger listens."""

    ui_url: str
    otlp_endpoint: str  # gRPC, for OTEL_EXPORTER_OTLP_ENDPOINT

    def otel_env(self) -> dict[str, str]:
        """The settings that make a service export its spans here (and nowhere else)."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRICS_EXPORTER": "none",
                "OTEL_BSP_SCHEDULE_DELAY": "200"}

    def trace_url(self, trace_id: str) -> str:
        return f"{self.ui_url}/trace/{trace_id}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.ui_url}{path}", timeout=5) as answer:  # noqa: S310
            return json.loads(answer.read())

    def services(self) -> list[str]:
        return list(self._get("/api/services").get("data") or [])

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as Jaeger's query API returns it (spans, processes), or None if unknown."""
        try:
            found = self._get(f"/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return dict(found[0]) if found else None


@contextmanager
def running() -> Iterator[Jaeger]:
    """A Jaeger of its own on free ports, stopped after."""
    ports = free_ports(dict.fromkeys((
        "JAEGER_UI_PORT", "JAEGER_OTLP_GRPC_PORT", "JAEGER_OTLP_HTTP_PORT", "JAEGER_HEALTH_PORT",
        "JAEGER_QUERY_GRPC_PORT")))
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           "JAEGER_UI_ASSETS": str(ui_assets())}
    found = Jaeger(f"http://127.0.0.1:{ports['JAEGER_UI_PORT']}",
                   f"http://127.0.0.1:{ports['JAEGER_OTLP_GRPC_PORT']}")
    health = f"http://127.0.0.1:{ports['JAEGER_HEALTH_PORT']}/status"
    with tempfile.TemporaryDirectory(prefix="al-jaeger-") as home:
        log_path = Path(home) / "jaeger.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(  # noqa: S603 (our own binary and config)
                [str(binary()), f"--config=file:{CONFIG}"], env=env, stdout=log,
                stderr=subprocess.STDOUT)
            try:
                def healthy() -> bool:
                    if proc.poll() is not None:
                        return True  # exited: stop waiting, the assertion below says why
                    try:
                        with urllib.request.urlopen(health, timeout=2) as answer:
                            return bool(json.loads(answer.read()).get("healthy"))
                    except (OSError, ValueError):
                        return False
                wait_until(healthy, timeout=START_TIMEOUT_S)
                assert proc.poll() is None and healthy(), (
                    "Jaeger did not become healthy:\n" + log_path.read_text(errors="replace"))
                yield found
            finally:
                terminate(proc, grace=10)
