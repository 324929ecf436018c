"""The operator's N-of-M approval rules (issue 42): what ``check-config`` names, and the
quorum a request gets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentledger import cli, errors
from agentledger.approvals import quorum
from agentledger.connectors import plugins
from agentledger.policy import allowlist
from agentledger.policy import check as check_mod

DEMO = plugins.defaults("http://127.0.0.1:8090")
RULES = allowlist.Allowlist.load()
REFUND = "billing.refund.create"
GROUP = {"role": "finance-approver", "members": ["user:fiona", "user:frank", "user:fred"]}
RULE = {"name": "large-refunds", "action": REFUND, "argument": "amount_minor", "above": 50_000,
        "group": "finance", "required": 2}


def _file(tmp_path: Path, group: dict[str, Any] = GROUP, *rules: dict[str, Any]) -> Path:
    path = tmp_path / "approvals.json"
    path.write_text(json.dumps({"format": quorum.FILE_FORMAT, "groups": {"finance": group},
                                "rules": list(rules or [RULE])}))
    return path


def test_a_good_file_checks_and_the_command_shows_the_rule(tmp_path: Path) -> None:
    report = check_mod.check(None, None, DEMO, approvals_path=_file(tmp_path))
    assert report.ok, report.problems
    ran = CliRunner().invoke(cli.app, ["check-config", "--approvals", str(_file(tmp_path))])
    assert ran.exit_code == 0, ran.output
    assert ("approval rule large-refunds: billing.refund.create with amount_minor above 50000 "
            "needs 2 of 3 approvers of role finance-approver (group finance)"
            ) in " ".join(ran.output.split())


@pytest.mark.parametrize(("group", "rule", "problem"), [
    ({**GROUP, "role": "finance-approvr"}, RULE,
     "approval group finance: unknown role 'finance-approvr' (the policies let "
     "['approver', 'finance-approver'] approve)"),
    (GROUP, {**RULE, "required": 4},
     "approval rule large-refunds: needs 4 approvers but group finance has 3"),
    (GROUP, {**RULE, "argument": "reason"},
     "approval rule large-refunds: billing.refund.create.reason is not an integer argument"),
    (GROUP, {**RULE, "group": "legal"}, "approval rule large-refunds: unknown group 'legal'"),
    (GROUP, {**RULE, "action": "billing.refund.make"},
     "approval rule large-refunds: unknown action 'billing.refund.make'"),
    (GROUP, {**RULE, "above": None}, "approval rule large-refunds: argument and above go together"),
])
def test_check_config_names_a_rule_that_cannot_work(
        tmp_path: Path, group: dict[str, Any], rule: dict[str, Any], problem: str) -> None:
    path = _file(tmp_path, group, rule)
    report = check_mod.check(None, None, DEMO, approvals_path=path)
    assert report.problems == [problem]
    with pytest.raises(errors.ConfigurationError) as refused:  # and admission will not start
        check_mod.load_approvals(path, RULES)
    assert refused.value.message == problem


def test_the_first_matching_rule_decides_else_one_approver() -> None:
    found = quorum.ApprovalRules.parse({"format": quorum.FILE_FORMAT,
                                        "groups": {"finance": GROUP}, "rules": [RULE]})
    assert found.quorum(REFUND, {"amount_minor": 60_000}) == quorum.Quorum(
        2, "finance-approver", "large-refunds")
    assert found.quorum(REFUND, {"amount_minor": 50_000}) == quorum.ONE
    assert found.quorum("crm.note.create", {}) == quorum.ONE
    assert quorum.ApprovalRules.empty().quorum(REFUND, {"amount_minor": 10**6}) == quorum.ONE
