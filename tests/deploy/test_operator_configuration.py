"""A service started outside the demo profile without its operator's configuration refuses to
start, in one line (issue 38) — the real module, as a deployment starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentledger import identity
from agentledger.policy import allowlist

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


def test_admission_refuses_to_start_on_a_narrow_rule_that_cannot_work(tmp_path: Path) -> None:
    # Issue 42: a `decrease` on an argument that is not a number is named in one line, as
    # `agentledger check-config` names it (every service loads the allowlist the same way).
    document = json.loads(allowlist.DEFAULT_PATH.read_text())
    refund = next(a for a in document["actions"] if a["name"] == "billing.refund.create")
    refund["narrowable"] = {"reason": "decrease"}
    path = tmp_path / "allowlist.json"
    path.write_text(json.dumps(document))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env |= {"AGENTLEDGER_PROFILE": "demo", "AGENTLEDGER_ALLOWLIST": str(path),
            "AGENTLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "AGENTLEDGER_MASTER_KEY": "A" * 43 + "=",
            "AGENTLEDGER_ADMISSION_REQUIRE_IDENTITY": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.services.admission"], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"agentledger admission: allowlist {path}: billing.refund.create: narrow "
                    "rule reason: decrease needs an integer or number argument, reason is "
                    "string"), done.stderr


def test_the_console_refuses_to_start_on_approval_rules_that_cannot_work(
        tmp_path: Path) -> None:
    # Issue 42: the console recomputes a narrowed request's quorum from the operator's
    # approval rules, so it checks them as admission does, before anything is connected.
    approvals = tmp_path / "approvals.json"
    approvals.write_text(json.dumps({
        "format": "agentledger.approvals.v1",
        "groups": {"finance": {"role": "finance-approver", "members": ["user:fiona"]}},
        "rules": [{"name": "large-refunds", "action": "billing.refund.create",
                   "argument": "amount_minor", "above": 50000, "group": "finance",
                   "required": 2}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    _, public_pem = identity.generate_keypair("EdDSA")
    env |= {"AGENTLEDGER_PROFILE": "demo", "AGENTLEDGER_APPROVALS": str(approvals),
            "AGENTLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "AGENTLEDGER_MASTER_KEY": "A" * 43 + "=",
            "AGENTLEDGER_CONSOLE_SESSION_KEYS": json.dumps({"k1": public_pem}),
            "AGENTLEDGER_CONSOLE_SESSION_ISSUER": "https://idp.example"}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.services.console"], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "agentledger console: approval rule large-refunds: needs 2 approvers but group "
        "finance has 1"), done.stderr


def test_the_notifier_refuses_to_start_on_routing_that_cannot_work(tmp_path: Path) -> None:
    # Issue 42: a channel whose signing secret is not set is named in one line, as
    # `agentledger check-config` names it, before anything is connected.
    approvals = tmp_path / "approvals.json"
    hooks = {m: {"webhook": f"https://hooks.example/{m[5:]}"}
             for m in ("user:fiona", "user:frank")}
    approvals.write_text(json.dumps({
        "format": "agentledger.approvals.v2",
        "channels": {"hook": {"plugin": "webhook",
                              "options": {"secret_env": "AGENTLEDGER_NOTIFY_HOOK_SECRET"}}},
        "groups": {"finance": {"role": "finance-approver", "members": list(hooks),
                               "channels": ["hook"], "contacts": hooks}},
        "rules": [{"name": "large-refunds", "action": "billing.refund.create",
                   "argument": "amount_minor", "above": 50000, "group": "finance",
                   "required": 2}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env |= {"AGENTLEDGER_PROFILE": "demo", "AGENTLEDGER_APPROVALS": str(approvals),
            "AGENTLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.services.notifier"], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "agentledger notifier: approval channel hook: webhook: signing secret "
        "AGENTLEDGER_NOTIFY_HOOK_SECRET is not set"), done.stderr
