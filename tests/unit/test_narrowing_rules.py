"""Narrow-only edits (issue 42): what an action may declare, what ``check-config`` names, and
which edits narrow (pure rules; the edit itself is tests/integration/test_approval_narrowing.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentledger import cli, errors
from agentledger.approvals import narrowing as approval_narrowing
from agentledger.budgets import rules as budget_rules
from agentledger.connectors import plugins
from agentledger.policy import allowlist, narrowing
from agentledger.policy import check as check_mod

DEMO = plugins.defaults("http://127.0.0.1:8090")
REFUND = "billing.refund.create"
MAIL = {"name": "mail.send", "connector": "crm", "risk": "medium", "requires_revision": False,
        "description": "A message to several recipients.",
        "narrowable": {"recipients": "subset"},
        "arguments": {"type": "object", "additionalProperties": False,
                      "required": ["recipients", "subject"],
                      "properties": {
                          "recipients": {"type": "array", "minItems": 1, "maxItems": 10,
                                         "items": {"type": "string", "maxLength": 200}},
                          "subject": {"type": "string", "maxLength": 200}}}}


def _allowlist(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    document = json.loads(allowlist.DEFAULT_PATH.read_text())
    mutate(document)
    path = tmp_path / "allowlist.json"
    path.write_text(json.dumps(document))
    return path


def _refund_narrows(rule: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        next(a for a in document["actions"] if a["name"] == REFUND)["narrowable"] = rule
    return mutate


def test_the_packaged_refund_declares_its_amount_may_decrease() -> None:
    spec = allowlist.Allowlist.load().get(REFUND)
    assert dict(spec.narrowable) == {"amount_minor": "decrease"}
    assert dict(allowlist.Allowlist.load().get("crm.note.create").narrowable) == {}
    report = check_mod.check(None, None, DEMO)
    assert report.ok and report.narrow_rules == {REFUND: {"amount_minor": "decrease"}}
    ran = CliRunner().invoke(cli.app, ["check-config"])
    assert ran.exit_code == 0, ran.output
    assert ("narrow rule billing.refund.create.amount_minor: an approver may lower it "
            "(decrease)") in " ".join(ran.output.split())
    ran = CliRunner().invoke(cli.app, ["check-config", "--json"])
    assert json.loads(ran.output)["narrow_rules"] == {REFUND: {"amount_minor": "decrease"}}


@pytest.mark.parametrize(("rule", "problem"), [
    ({"reason": "decrease"},
     "billing.refund.create: narrow rule reason: decrease needs an integer or number argument, "
     "reason is string"),
    ({"amount_minor": "subset"},
     "billing.refund.create: narrow rule amount_minor: subset needs an array argument, "
     "amount_minor is integer"),
    ({"amount": "decrease"},
     "billing.refund.create: narrow rule amount: billing.refund.create has no argument amount"),
])
def test_check_config_names_a_narrow_rule_that_cannot_work(
        tmp_path: Path, rule: dict[str, Any], problem: str) -> None:
    path = _allowlist(tmp_path, _refund_narrows(rule))
    report = check_mod.check(path, None, DEMO)
    assert report.problems == [f"allowlist: allowlist {path}: {problem}"]
    ran = CliRunner().invoke(cli.app, ["check-config", "--allowlist", str(path)])
    assert ran.exit_code == 1 and problem in " ".join(ran.output.split()), ran.output
    # Every service loads the allowlist this way, so none starts on it.
    with pytest.raises(errors.ValidationFailed) as refused:
        allowlist.Allowlist.load(path)
    assert refused.value.message.endswith(problem)


def test_an_unknown_kind_is_refused_by_the_file_format(tmp_path: Path) -> None:
    path = _allowlist(tmp_path, _refund_narrows({"amount_minor": "halve"}))
    report = check_mod.check(path, None, DEMO)
    assert len(report.problems) == 1 and "narrowable" in report.problems[0], report.problems


def test_the_declaration_check_names_every_problem() -> None:
    schema = MAIL["arguments"]
    assert narrowing.declaration_problems("mail.send", schema, {"recipients": "subset"}) == []
    assert narrowing.declaration_problems("mail.send", schema, {
        "recipients": "decrease", "subject": "subset", "cc": "subset", "x": "shrink"}) == [
        "mail.send: narrow rule cc: mail.send has no argument cc",
        "mail.send: narrow rule recipients: decrease needs an integer or number argument, "
        "recipients is array",
        "mail.send: narrow rule subject: subset needs an array argument, subject is string",
        "mail.send: narrow rule x: unknown kind 'shrink' (one of decrease, subset)"]


REFUND_ARGS = {"customer_id": "c-1", "invoice_id": "inv-1", "amount_minor": 60_000,
               "currency": "EUR", "reason": "damaged"}
DECREASE = {"amount_minor": "decrease"}


def test_a_lower_amount_narrows() -> None:
    assert narrowing.check(REFUND, DECREASE, REFUND_ARGS,
                           {**REFUND_ARGS, "amount_minor": 40_000}) == ["amount_minor"]


@pytest.mark.parametrize(("narrowed", "says"), [
    ({**REFUND_ARGS, "amount_minor": 70_000}, "amount_minor may only decrease"),
    ({**REFUND_ARGS, "reason": "goodwill"}, "reason is not declared narrowable"),
    ({**REFUND_ARGS, "invoice_id": "inv-2", "amount_minor": 1}, "invoice_id is not declared"),
    (REFUND_ARGS, "nothing was narrowed"),
    ({k: v for k, v in REFUND_ARGS.items() if k != "reason"}, "reason may not be added or removed"),
    ({**REFUND_ARGS, "note": "x"}, "note may not be added or removed"),
    ({**REFUND_ARGS, "amount_minor": True}, "amount_minor is not a number"),
])
def test_anything_else_is_refused_naming_the_field_never_the_value(
        narrowed: dict[str, Any], says: str) -> None:
    with pytest.raises(errors.NarrowingRefused) as refused:
        narrowing.check(REFUND, DECREASE, REFUND_ARGS, narrowed)
    assert says in refused.value.message and refused.value.code == "narrowing_refused"
    assert not refused.value.retryable
    for value in ("70000", "goodwill", "inv-2"):
        assert value not in refused.value.message


MAIL_ARGS = {"recipients": ["a@example.com", "b@example.com", "c@example.com"], "subject": "Hi"}
SUBSET = {"recipients": "subset"}


def test_fewer_recipients_in_the_proposed_order_narrow() -> None:
    kept = {**MAIL_ARGS, "recipients": ["a@example.com", "c@example.com"]}
    assert narrowing.check("mail.send", SUBSET, MAIL_ARGS, kept) == ["recipients"]


@pytest.mark.parametrize(("recipients", "says"), [
    (["a@example.com", "d@example.com"], "may only lose items"),
    (["a@example.com", "a@example.com"], "may only lose items"),  # one a, kept twice
    (["c@example.com", "a@example.com"], "must keep the proposed order"),
    (MAIL_ARGS["recipients"], "nothing was narrowed"),
])
def test_an_added_repeated_or_reordered_recipient_is_refused(recipients: list[str],
                                                             says: str) -> None:
    with pytest.raises(errors.NarrowingRefused) as refused:
        narrowing.check("mail.send", SUBSET, MAIL_ARGS, {**MAIL_ARGS, "recipients": recipients})
    assert says in refused.value.message


def test_a_declared_subset_loads_from_an_allowlist() -> None:
    document = {"format": allowlist.FILE_FORMAT, "actions": [MAIL]}
    spec = allowlist.Allowlist.from_document(document).get("mail.send")
    assert dict(spec.narrowable) == SUBSET


BUDGETS = budget_rules.Budgets.parse({"format": "agentledger.budgets.v1", "budgets": [
    {"name": "eur-day", "scope": "principal", "window": "day", "unit": "amount",
     "limit": 100_000, "actions": [REFUND], "amount_argument": "amount_minor",
     "currency_argument": "currency", "currency": "EUR"},
    {"name": "calls-hour", "scope": "tenant", "window": "hour", "unit": "calls",
     "limit": 10, "actions": [REFUND]}]})


def test_the_narrowed_command_is_charged_its_own_amount_in_the_originals_windows() -> None:
    day = datetime(2026, 12, 6, tzinfo=UTC)
    reserved = [
        {"budget": "calls-hour", "scope": "tenant", "scope_key": "tenant",
         "window_kind": "hour", "window_start": day, "unit": "calls", "currency": None,
         "amount": 1, "limit_amount": 10},
        {"budget": "eur-day", "scope": "principal", "scope_key": "user:alice",
         "window_kind": "day", "window_start": day, "unit": "amount", "currency": "EUR",
         "amount": 60_000, "limit_amount": 100_000},
        {"budget": "gone", "scope": "tenant", "scope_key": "tenant", "window_kind": "call",
         "window_start": None, "unit": "amount", "currency": "EUR", "amount": 60_000,
         "limit_amount": 90_000}]
    found = json.loads(approval_narrowing.charges(
        reserved, BUDGETS, {**REFUND_ARGS, "amount_minor": 40_000}) or "[]")
    assert [(c["budget"], c["amount"], c["window_start"], c["limit"]) for c in found] == [
        ("calls-hour", 1, day.isoformat(), 10), ("eur-day", 40_000, day.isoformat(), 100_000),
        # A budget the operator no longer declares keeps the original's amount.
        ("gone", 60_000, None, 90_000)]
    assert approval_narrowing.charges([], BUDGETS, REFUND_ARGS) is None


@pytest.mark.parametrize(("floor", "named"), [
    ({}, True), ({"minimum": -100}, True), ({"exclusiveMinimum": -1}, True),
    ({"minimum": 0}, False), ({"minimum": 1}, False), ({"exclusiveMinimum": 0}, False)])
def test_a_decrease_needs_a_floor_at_zero_or_above(floor: dict[str, int], named: bool) -> None:
    """Without one, "lower" reaches past zero: -10,000 is a larger effect, not a narrower one."""
    schema = {"type": "object", "properties": {"amount": {"type": "integer", **floor}}}
    found = narrowing.declaration_problems("pay.send", schema, {"amount": "decrease"})
    assert found == ([
        "pay.send: narrow rule amount: decrease needs a minimum of 0 or more on amount "
        "(its schema has none)"] if named else [])
