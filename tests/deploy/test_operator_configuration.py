"""A service started outside the demo profile without its operator's configuration refuses to
start, in one line (issue 38) — the real module, as a deployment starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SERVICES = ["admission", "executor", "reconciler", "planner", "console", "mcp", "notifier"]
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


def test_admission_refuses_to_start_on_budgets_that_do_not_fit_the_allowlist(
        tmp_path: Path) -> None:
    # Issue 42: the budget file is checked as `agentledger check-config` checks it, before
    # anything is connected; the problem is named in one line.
    budgets = tmp_path / "budgets.json"
    budgets.write_text('{"format": "agentledger.budgets.v1", "budgets": [{"name": "refunds", '
                '"scope": "principal", "window": "day", "unit": "amount", "limit": 1, '
                '"actions": ["billing.refund.create"], "amount_argument": "reason", '
                '"currency_argument": "currency", "currency": "EUR"}]}')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env |= {"AGENTLEDGER_PROFILE": "demo", "AGENTLEDGER_BUDGETS": str(budgets),
            "AGENTLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "AGENTLEDGER_MASTER_KEY": "A" * 43 + "=",
            "AGENTLEDGER_ADMISSION_REQUIRE_IDENTITY": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.services.admission"], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("agentledger admission: budget refunds: billing.refund.create.reason is "
                    "not an integer argument"), done.stderr
