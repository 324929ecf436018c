"""The operator's budgets (issue 42): the file's validation, ``check-config``'s problems, the
charges a command costs, and the calendar UTC windows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentledger import cli, errors
from agentledger.budgets import rules
from agentledger.connectors import plugins
from agentledger.policy import allowlist
from agentledger.policy import check as check_mod

DEMO = plugins.defaults("http://127.0.0.1:8090")
RULES = allowlist.Allowlist.load()
REFUND = "billing.refund.create"
EUR_DAY = {"name": "refunds-eur-day", "scope": "principal", "window": "day", "unit": "amount",
           "limit": 100_000, "actions": [REFUND], "amount_argument": "amount_minor",
           "currency_argument": "currency", "currency": "EUR"}
runner = CliRunner()


def _file(tmp_path: Path, *budgets: dict[str, Any]) -> Path:
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps({"format": rules.FILE_FORMAT, "budgets": list(budgets)}))
    return path


def test_a_good_file_checks_and_is_versioned_by_content(tmp_path: Path) -> None:
    report = check_mod.check(None, None, DEMO, _file(tmp_path, EUR_DAY))
    assert report.ok, report.problems
    assert report.budgets_version is not None and report.budgets_version.startswith("sha256:")
    assert [b["name"] for b in report.budgets] == ["refunds-eur-day"]
    # Reformatted, the same version.
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4, sort_keys=True))
    assert rules.Budgets.load(path).version == report.budgets_version


@pytest.mark.parametrize(("change", "problem"), [
    ({"actions": ["billing.refund.make"]},
     "budget refunds-eur-day: unknown action 'billing.refund.make'"),
    ({"amount_argument": "reason"},
     "budget refunds-eur-day: billing.refund.create.reason is not an integer argument"),
    ({"amount_argument": "amount"},
     "budget refunds-eur-day: billing.refund.create.amount is not an integer argument"),
    ({"currency_argument": "amount_minor"},
     "budget refunds-eur-day: billing.refund.create.amount_minor is not a string argument"),
    ({"currency": "JPY"},
     "budget refunds-eur-day: billing.refund.create never takes currency JPY "
     "(billing.refund.create.currency is one of ['EUR', 'USD', 'GBP', 'CHF'])"),
])
def test_check_config_names_a_budget_that_does_not_fit_the_allowlist(
        tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    report = check_mod.check(None, None, DEMO, _file(tmp_path, {**EUR_DAY, **change}))
    assert report.problems == [problem]
    # And a service about to start on it refuses, naming the same.
    with pytest.raises(errors.ConfigurationError) as refused:
        check_mod.load_budgets(tmp_path / "budgets.json", RULES)
    assert refused.value.message == problem


@pytest.mark.parametrize(("change", "fragment"), [
    ({"scope": "team"}, "budgets.0.scope"),
    ({"window": "week"}, "budgets.0.window"),
    ({"limit": -1}, "budgets.0.limit"),
    ({"currency": None}, "unit 'amount' needs amount_argument, currency_argument and currency"),
    ({"unit": "calls"}, "belong to unit 'amount' only"),
    ({"colour": "red"}, "budgets.0.colour"),
])
def test_a_malformed_budget_is_named(tmp_path: Path, change: dict[str, Any],
                                     fragment: str) -> None:
    report = check_mod.check(None, None, DEMO, _file(tmp_path, {**EUR_DAY, **change}))
    assert len(report.problems) == 1 and fragment in report.problems[0], report.problems


def test_a_name_declared_twice_is_a_problem(tmp_path: Path) -> None:
    report = check_mod.check(None, None, DEMO, _file(tmp_path, EUR_DAY, EUR_DAY))
    assert report.problems == ["budgets: declared twice: refunds-eur-day"]


def test_the_command_prints_the_budgets_and_exits_1_on_a_problem(tmp_path: Path) -> None:
    good = _file(tmp_path, EUR_DAY)
    ran = runner.invoke(cli.app, ["check-config", "--budgets", str(good)])
    assert ran.exit_code == 0, ran.output
    shown = " ".join(ran.output.split())  # the console wraps at its width
    assert "budget refunds-eur-day: 100000 amount EUR from amount_minor per principal per " \
        "day on billing.refund.create" in shown
    bad = _file(tmp_path, {**EUR_DAY, "actions": ["nope"]})
    ran = runner.invoke(cli.app, ["check-config", "--budgets", str(bad), "--json"])
    assert ran.exit_code == 1
    assert json.loads(ran.stdout)["problems"] == ["budget refunds-eur-day: unknown action 'nope'"]


def test_charges_follow_scope_window_unit_and_currency() -> None:
    found = rules.Budgets.parse({"format": rules.FILE_FORMAT, "budgets": [
        EUR_DAY,
        {"name": "calls-per-run-hour", "scope": "run", "window": "hour", "unit": "calls",
         "limit": 5},
        {"name": "tokens-per-tenant-call", "scope": "tenant", "window": "call",
         "unit": "tokens", "limit": 10_000},
    ]})
    now = datetime(2026, 12, 6, 23, 59, 59, tzinfo=UTC)
    args = {"amount_minor": 60_000, "currency": "EUR"}
    charges = found.charges(action=REFUND, arguments=args, principal_id="user:alice",
                            run_id="run-1", tokens=300, now=now)
    assert [(c.budget, c.scope_key, c.window_start, c.amount) for c in charges] == [
        ("refunds-eur-day", "user:alice", datetime(2026, 12, 6, tzinfo=UTC), 60_000),
        ("calls-per-run-hour", "run-1", datetime(2026, 12, 6, 23, tzinfo=UTC), 1),
        ("tokens-per-tenant-call", rules.TENANT_KEY, None, 300)]
    # Another currency, no run, no tokens: only what applies is charged.
    other = found.charges(action=REFUND, arguments={**args, "currency": "USD"},
                          principal_id="user:alice", run_id=None, tokens=0, now=now)
    assert other == []
    # Another action: only the budgets over every action.
    note = found.charges(action="crm.note.create", arguments={"body": "x"},
                         principal_id="user:alice", run_id="run-1", tokens=0, now=now)
    assert [c.budget for c in note] == ["calls-per-run-hour"]


def test_windows_are_calendar_utc() -> None:
    local = timezone(timedelta(hours=2))
    at = datetime(2026, 12, 7, 1, 30, tzinfo=local)  # 23:30 UTC on the 6th
    assert rules.window_start("day", at) == datetime(2026, 12, 6, tzinfo=UTC)
    assert rules.window_start("hour", at) == datetime(2026, 12, 6, 23, tzinfo=UTC)
    assert rules.window_start("call", at) is None


def test_a_long_scope_key_is_cut_to_a_digest() -> None:
    found = rules.Budgets.parse({"format": rules.FILE_FORMAT, "budgets": [
        {"name": "p", "scope": "principal", "window": "day", "unit": "calls", "limit": 1}]})
    [charge] = found.charges(action="x", arguments={}, principal_id="p" * 300, run_id=None,
                             tokens=0, now=datetime.now(UTC))
    assert charge.scope_key.startswith("sha256:") and len(charge.scope_key) <= 200
