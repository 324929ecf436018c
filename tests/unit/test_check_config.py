"""``agentledger check-config`` and the configured allowlist and policy paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentledger import cli
from agentledger.connectors import plugins
from agentledger.policy import allowlist, cedar
from agentledger.policy import check as check_mod

DEMO = plugins.defaults("http://127.0.0.1:8090")
runner = CliRunner()


def test_the_packaged_configuration_checks_and_the_role_table_says_what_each_role_gets() -> None:
    report = check_mod.check(None, None, DEMO)
    assert report.ok, report.problems
    assert report.allowlist_version == allowlist.Allowlist.load().version
    assert report.policy_version == cedar.CedarPolicy().version
    assert report.connectors["crm"]["idempotency"] == "keyed" and report.connectors["crm"]["lookup"]
    assert report.roles["user"] == {"billing.refund.create": "require_approval",
                                    "crm.contact.update": "require_approval",
                                    "crm.note.create": "allow"}
    assert set(report.roles["approver"].values()) == {"deny"}  # approving is not performing
    assert set(report.roles) == {"agent-operator", "approver", "finance-approver", "user"}


def _allowlist(tmp_path: Path, mutate: object) -> Path:
    document = json.loads(allowlist.DEFAULT_PATH.read_text())
    mutate(document)  # type: ignore[operator]
    path = tmp_path / "allowlist.json"
    path.write_text(json.dumps(document))
    return path


def test_an_action_its_connector_does_not_declare_is_a_problem(tmp_path: Path) -> None:
    def move(doc: dict) -> None:  # type: ignore[type-arg]
        next(a for a in doc["actions"] if a["name"] == "crm.note.create")["connector"] = "billing"
    report = check_mod.check(_allowlist(tmp_path, move), None, DEMO)
    assert report.problems == [
        "action crm.note.create: connector 'billing' does not declare it (it declares "
        "['billing.refund.create'])"]


def test_an_unconfigured_connector_and_an_open_schema_are_problems(tmp_path: Path) -> None:
    report = check_mod.check(None, None, {"crm": {"url": "http://127.0.0.1:8090"}})
    assert report.problems == ["action billing.refund.create: connector 'billing' is not "
                               "configured"]

    def open_schema(doc: dict) -> None:  # type: ignore[type-arg]
        doc["actions"][0]["arguments"]["additionalProperties"] = True
    report = check_mod.check(_allowlist(tmp_path, open_schema), None, DEMO)
    assert len(report.problems) == 1 and report.problems[0].startswith("allowlist: ")
    assert report.allowlist_version is None and report.roles == {}


def test_a_policy_that_does_not_validate_is_a_problem(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(cedar.DEFAULT_DIR, policies)
    (policies / "30_typo.cedar").write_text(
        '@id("typo")\npermit (principal, action == AgentLedger::Action::"perform", resource)\n'
        'when { principal.rolez.contains("user") };\n')
    report = check_mod.check(None, policies, DEMO)
    assert len(report.problems) == 1 and report.problems[0].startswith("policies: ")


def test_the_services_read_the_configured_paths(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def drop_refunds(doc: dict) -> None:  # type: ignore[type-arg]
        doc["actions"] = [a for a in doc["actions"] if a["connector"] != "billing"]
    path = _allowlist(tmp_path, drop_refunds)
    policies = tmp_path / "policies"
    shutil.copytree(cedar.DEFAULT_DIR, policies)
    (policies / "05_no_contacts.cedar").write_text(
        '@id("no-contact-updates")\nforbid (principal, action, resource)\n'
        'when { context.operation.name == "crm.contact.update" };\n')
    monkeypatch.setenv("AGENTLEDGER_ALLOWLIST", str(path))
    monkeypatch.setenv("AGENTLEDGER_POLICY_DIR", str(policies))
    loaded = allowlist.Allowlist.load()
    assert set(loaded.actions) == {"crm.note.create", "crm.contact.update"}
    assert loaded.version != allowlist.Allowlist.load(allowlist.DEFAULT_PATH).version
    assert cedar.CedarPolicy().version != cedar.CedarPolicy(cedar.DEFAULT_DIR).version
    report = check_mod.check(None, None, {"crm": {"url": "http://127.0.0.1:8090"}})
    assert report.ok, report.problems
    assert report.roles["user"] == {"crm.contact.update": "deny", "crm.note.create": "allow"}


def test_the_command_exits_1_on_a_problem_and_prints_json() -> None:
    done = runner.invoke(cli.app, ["check-config", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["ok"] is True
    bad = runner.invoke(cli.app, ["check-config", "--connectors",
                                  '{"crm": {"url": "http://127.0.0.1:8090"}}'])
    assert bad.exit_code == 1 and "connector 'billing' is not configured" in bad.output
    usage = runner.invoke(cli.app, ["check-config", "--connectors", "[1]"])
    assert usage.exit_code == 2
