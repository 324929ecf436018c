"""A service started outside the demo profile without its operator's configuration refuses to
start, in one line (issue 38) — the real module, as a deployment starts it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SERVICES = ["admission", "executor", "reconciler", "planner", "console", "mcp"]
# The MCP server is the library's, not a service package (issue 40: it checks too).
MODULES = {"mcp": "agentledger.mcp"}


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_without_configuration_names_it_and_stops(service: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-m", MODULES.get(service, f"agentledger.services.{service}")], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"agentledger {service}: AGENTLEDGER_") and (
        "AGENTLEDGER_PROFILE=demo" in lines[0]), lines
