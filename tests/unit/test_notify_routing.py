"""Routing of pending approvals (issue 42 item 1): what ``check-config`` names in a v2
approval file, and who a request is routed to."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentledger import errors
from agentledger.approvals import quorum
from agentledger.connectors import plugins as connector_plugins
from agentledger.notify import routing
from agentledger.policy import allowlist
from agentledger.policy import check as check_mod

DEMO = connector_plugins.defaults("http://127.0.0.1:8090")
RULES = allowlist.Allowlist.load()
SECRET_ENV = "AGENTLEDGER_TEST_NOTIFY_SECRET"
MEMBERS = ["user:fiona", "user:frank", "user:fred"]
CONTACTS = {m: {"email": f"{m[5:]}@example.com", "webhook": f"https://hooks.example.com/{m[5:]}"}
            for m in MEMBERS}
LEADS = ["user:lena", "user:leo"]


def _document(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": quorum.ROUTED_FORMAT,
        "channels": {
            "hook": {"plugin": "webhook", "options": {"secret_env": SECRET_ENV}},
            "mail": {"plugin": "email", "options": {
                "smtp_port": 1025, "sender": "approvals@example.com",
                "message_id_domain": "approvals.example.com"}}},
        "groups": {
            "finance": {"role": "finance-approver", "members": MEMBERS,
                        "channels": ["hook", "mail"], "contacts": CONTACTS},
            "leads": {"role": "finance-approver", "members": LEADS, "channels": ["mail"],
                      "contacts": {m: {"email": f"{m[5:]}@example.com"} for m in LEADS}}},
        "rules": [{"name": "large-refunds", "action": "billing.refund.create",
                   "argument": "amount_minor", "above": 50_000, "group": "finance",
                   "required": 2, "escalate_to": "leads", "escalate_after": "PT1H"}]}
    doc = copy.deepcopy(doc)
    for path, value in change.items():
        *parents, last = path.split("__")
        at = doc
        for p in parents:
            at = at[int(p)] if isinstance(at, list) else at[p]
        if value is None:
            del at[last]
        else:
            at[last] = value
    return doc


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s" * 32)


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "approvals.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_routed_file_checks_and_routes_the_rule_group(tmp_path: Path) -> None:
    report = check_mod.check(None, None, DEMO, approvals_path=_write(tmp_path, _document()))
    assert report.ok, report.problems
    found = quorum.ApprovalRules.parse(_document())
    kinds = routing.contact_kinds(found)
    assert kinds == {"hook": "webhook", "mail": "email"}
    sent = routing.recipients(found, "finance", kinds)
    assert [(r.member, r.channel) for r in sent] == [
        (m, c) for m in MEMBERS for c in ("hook", "mail")]
    assert sent[0].address == "https://hooks.example.com/fiona"
    assert sent[1].address == "fiona@example.com"
    assert routing.recipients(found, None, kinds) == []
    rule = found.rule("large-refunds")
    assert rule is not None and rule.escalate_after is not None
    assert rule.escalate_after.total_seconds() == 3600


def test_check_config_shows_the_escalation(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentledger import cli

    ran = CliRunner().invoke(cli.app, ["check-config", "--approvals",
                                       str(_write(tmp_path, _document()))])
    assert ran.exit_code == 0, ran.output
    assert ("approval rule large-refunds: billing.refund.create with amount_minor above 50000 "
            "needs 2 of 3 approvers of role finance-approver (group finance), escalated to "
            "leads after PT1H") in " ".join(ran.output.split())


def test_a_v1_file_stays_valid_and_routes_nowhere(tmp_path: Path) -> None:
    doc = {"format": quorum.FILE_FORMAT,
           "groups": {"finance": {"role": "finance-approver", "members": MEMBERS}},
           "rules": [{"name": "large-refunds", "action": "billing.refund.create",
                      "argument": "amount_minor", "above": 50_000, "group": "finance",
                      "required": 2}]}
    assert check_mod.check(None, None, DEMO, approvals_path=_write(tmp_path, doc)).ok
    found = quorum.ApprovalRules.parse(doc)
    assert routing.recipients(found, "finance", routing.contact_kinds(found)) == []


@pytest.mark.parametrize(("change", "problem"), [
    ({"format": quorum.FILE_FORMAT},
     "approvals: channels, contacts and escalation need format agentledger.approvals.v2 "
     "(this file is agentledger.approvals.v1)"),
    ({"groups__finance__channels": ["hook", "pager"]},
     "approval group finance: unknown channel 'pager' (declared: ['hook', 'mail'])"),
    ({"channels__hook__plugin": "pager"},
     "approval channel hook: unknown plugin 'pager' (installed: ['email', 'webhook'])"),
    ({"rules__0__escalate_to": "legal"},
     "approval rule large-refunds: escalate_to names unknown group 'legal'"),
    ({"rules__0__escalate_to": "finance"},
     "approval rule large-refunds: escalates to its own group finance (a cycle)"),
    ({"rules__0__escalate_after": None},
     "approval rule large-refunds: escalate_to and escalate_after go together"),
    ({"rules__0__escalate_after": -5},
     "approval rule large-refunds: escalate_after must be a positive duration"),
    ({"groups__leads__role": "approver"},
     "approval rule large-refunds: escalates to group leads of role 'approver', but the "
     "request needs role 'finance-approver'"),
    ({"groups__finance__contacts__user:fred": {"email": "fred@example.com"}},
     "approval group finance: user:fred has no webhook contact for channel hook"),
    ({"groups__finance__contacts__user:fred": {"webhook": "https://h.example.com/f"}},
     "approval group finance: user:fred has no email contact for channel mail"),
    ({"groups__finance__contacts__user:fred": {"email": "fred@example.com",
                                               "webhook": "ftp://h.example.com/f"}},
     "approval group finance: user:fred's webhook 'ftp://h.example.com/f' is not an "
     "http(s) URL"),
    ({"groups__finance__contacts__user:zed": {"email": "zed@example.com"}},
     "approval group finance: contact for user:zed, who is not a member"),
    ({"channels__hook__options": {"secret_env": "AGENTLEDGER_NOT_SET_ANYWHERE"}},
     "approval channel hook: webhook: signing secret AGENTLEDGER_NOT_SET_ANYWHERE is not set"),
    ({"channels__hook__options": {"secret_env": "whsec_literal-secret"}},
     "approval channel hook: webhook: secret_env must name the environment variable holding "
     "the signing secret (the secret itself is never in the file)"),
    ({"channels__mail__options__smtp_port": "25"},
     "approval channel mail: email: smtp_port must be a port number"),
])
def test_check_config_names_what_routing_cannot_do(
        tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    path = _write(tmp_path, _document(**change))
    report = check_mod.check(None, None, DEMO, approvals_path=path)
    assert report.problems == [problem]
    with pytest.raises(errors.ConfigurationError) as refused:  # and the notifier will not start
        check_mod.load_approvals(path, RULES, channels=True)
    assert refused.value.message == problem
    if "channel hook: webhook" in problem or "channel mail: email" in problem:
        # Admission, which never sends, needs neither the secret nor the channel's options.
        assert check_mod.load_approvals(path, RULES).channels
    else:  # nor does it start on anything else
        with pytest.raises(errors.ConfigurationError):
            check_mod.load_approvals(path, RULES)


def test_admission_starts_without_the_signing_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV)
    path = _write(tmp_path, _document())
    assert check_mod.load_approvals(path, RULES).channels  # admission: no secret needed
    with pytest.raises(errors.ConfigurationError, match=f"{SECRET_ENV} is not set"):
        check_mod.load_approvals(path, RULES, channels=True)  # the notifier: refused


def test_a_short_secret_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "short")
    report = check_mod.check(None, None, DEMO, approvals_path=_write(tmp_path, _document()))
    assert report.problems == [f"approval channel hook: webhook: signing secret {SECRET_ENV} "
                               "is shorter than 16 bytes"]


def test_every_problem_is_named_not_only_the_first(tmp_path: Path) -> None:
    doc = _document(rules__0__escalate_to="legal", groups__finance__channels=["pager"])
    report = check_mod.check(None, None, DEMO, approvals_path=_write(tmp_path, doc))
    assert len(report.problems) == 2, report.problems
