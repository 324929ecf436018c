"""A 600 EUR refund narrowed to 400 through the console's JSON API, end to end (issue 42).

Real services as processes — admission and the console with the operator's approval file
("above 500 EUR needs 2 finance approvers"), relay, executors, reconciler, the billing
stand-in. A finance approver narrows 600 → 400 with ``POST /api/v1/approvals/{id}/narrow``:
the narrowed request needs one approver and is approved in the same step; the refund runs
once, for 400 (the provider's refunds read from its database), never for 600. The original
reads ``narrowed`` and links to the narrowed request, which shows both values; ``explain``
links them both ways. The requester's narrowing, a widening (600 → 700) and an edit of a
field that may not narrow are refused and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg2
import pytest
from typer.testing import CliRunner

from agentledger import cli
from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.stack import Stack

REFUND = "billing.refund.create"
FINANCE = ["user:fiona", "user:frank", "user:fred"]
APPROVALS = {"format": "agentledger.approvals.v1",
             "groups": {"finance": {"role": "finance-approver", "members": FINANCE}},
             "rules": [{"name": "large-refunds", "action": REFUND, "argument": "amount_minor",
                        "above": 50_000, "group": "finance", "required": 2}]}


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    config = tmp_path_factory.mktemp("config")
    (config / "approvals.json").write_text(json.dumps(APPROVALS))
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("narrowing"), console=True,
                  config_env={"AGENTLEDGER_APPROVALS": str(config / "approvals.json")}) as p:
        asyncio.run(identities.put_principals(
            database_url, p.tenant, {m: ["finance-approver"] for m in FINANCE[1:]}
            # The requester holds the approver role too: only the requester rule refuses her.
            | {"user:alice": ["user", "finance-approver"]}))
        yield p


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def _refunds(p: Pipeline, invoice: str) -> list[tuple[Any, ...]]:
    return _rows(p.crm.database_url, "SELECT amount_cents, currency FROM crm_refund "
                 "WHERE tenant_id = %s AND invoice_id = %s ORDER BY created_at", p.tenant, invoice)


def _ledger(p: Pipeline, op: uuid.UUID) -> list[tuple[Any, ...]]:
    return _rows(p.database_url, "SELECT approval_id::text, state, narrowed_from::text "
                 "FROM approval_request WHERE operation_id = %s ORDER BY created_at", str(op))


def _as(p: Pipeline, principal: str, roles: list[str]) -> dict[str, str]:
    assert p.sessions is not None
    return {"Authorization": f"Bearer {p.sessions.issue(p.tenant, principal, roles)}"}


def _pending(p: Pipeline, amount: int) -> tuple[uuid.UUID, str, str, dict[str, Any]]:
    invoice = f"inv-n-{uuid.uuid4().hex[:8]}"
    op = p.propose(REFUND, {"invoice_id": invoice, "amount_minor": amount, "currency": "EUR",
                            "reason": "damaged in transit"})
    assert wait_until(lambda: p.pending_approval(op), timeout=60)
    [(approval_id, _, _)] = _ledger(p, op)
    shown = httpx.get(f"{p.console_url}/api/v1/approvals/{approval_id}",
                      headers=_as(p, "user:fiona", ["finance-approver"]), timeout=30)
    assert shown.status_code == 200, shown.text
    return op, invoice, approval_id, shown.json()


def _narrow(p: Pipeline, approval_id: str, shown: dict[str, Any], principal: str,
            roles: list[str], **change: Any) -> httpx.Response:
    return httpx.post(f"{p.console_url}/api/v1/approvals/{approval_id}/narrow",
                      json={"shown_hash": shown["request_hash"],
                            "arguments": {**shown["arguments"], **change},
                            "reason": "partial refund agreed with the customer"},
                      headers=_as(p, principal, roles), timeout=30)


def test_a_refund_narrowed_from_600_to_400_runs_400_exactly_once(world: Pipeline) -> None:
    p = world
    assert p.sessions is not None and p.console_url
    op, invoice, approval_id, shown = _pending(p, 60_000)
    assert shown["narrowable"] == {"amount_minor": "decrease"}
    assert shown["quorum"]["required"] == 2

    done = _narrow(p, approval_id, shown, "user:fiona", ["finance-approver"],
                   amount_minor=40_000)
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["approval_id"], body["state"], body["fields"]) == (
        approval_id, "narrowed", ["amount_minor"])
    narrowed = body["narrowed"]
    assert (narrowed["state"], narrowed["required_approvals"], narrowed["decided_by"],
            narrowed["admitted"]) == ("approved", 1, "user:fiona", "admitted")
    assert narrowed["request_hash"] != shown["request_hash"]

    p.wait_state(op, "succeeded")
    assert _refunds(p, invoice) == [(40_000, "EUR")]
    assert _ledger(p, op) == [(approval_id, "narrowed", None),
                              (narrowed["approval_id"], "approved", approval_id)]
    [(command_hash,)] = _rows(p.database_url, "SELECT encode(request_hash, 'hex') FROM "
                              "agent_command WHERE operation_id = %s", str(op))
    assert command_hash == narrowed["request_hash"]

    headers = _as(p, "user:frank", ["finance-approver"])
    original = httpx.get(f"{p.console_url}/api/v1/approvals/{approval_id}", headers=headers,
                         timeout=30).json()
    assert (original["state"], original["narrowed_to"], original["narrowable"]) == (
        "narrowed", narrowed["approval_id"], {})
    now = httpx.get(f"{p.console_url}/api/v1/approvals/{narrowed['approval_id']}",
                    headers=headers, timeout=30).json()
    assert now["narrowed_from"] == approval_id
    assert now["narrowed_changes"] == [{"field": "amount_minor", "original": 60_000,
                                        "narrowed": 40_000}]
    # The original can no longer be approved: it was narrowed.
    late = httpx.post(f"{p.console_url}/api/v1/approvals/{approval_id}/approve",
                      json={"shown_hash": shown["request_hash"]}, headers=headers, timeout=30)
    assert late.status_code == 409 and late.json()["error"]["code"] == "narrowed", late.text

    explained = httpx.get(f"{p.console_url}/api/v1/operations/{op}/explain", headers=headers,
                          timeout=30)
    assert explained.status_code == 200, explained.text
    first, second = explained.json()["permitted"]["approvals"]
    assert (first["state"], first["narrowed_to"]) == ("narrowed", narrowed["approval_id"])
    assert (second["state"], second["narrowed_from"]) == ("approved", approval_id)
    audited = _rows(p.database_url, "SELECT payload->>'request_hash', payload->>'narrowed_hash' "
                    "FROM audit_event WHERE operation_id = %s AND type = 'approval.narrowed'",
                    str(op))
    assert audited == [(shown["request_hash"], narrowed["request_hash"])]


def test_widening_an_undeclared_field_and_the_requester_are_refused(world: Pipeline) -> None:
    p = world
    op, invoice, approval_id, shown = _pending(p, 60_000)
    before = _ledger(p, op)
    refusals = [
        (_narrow(p, approval_id, shown, "user:fiona", ["finance-approver"],
                 amount_minor=70_000), 422, "narrowing_refused"),
        (_narrow(p, approval_id, shown, "user:fiona", ["finance-approver"],
                 reason="goodwill"), 422, "narrowing_refused"),
        (_narrow(p, approval_id, shown, "user:alice", ["user", "finance-approver"],
                 amount_minor=40_000), 403, "not_permitted"),
    ]
    for answer, status, code in refusals:
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
    assert _ledger(p, op) == before == [(approval_id, "pending", None)]
    assert p.state(op) is None and _refunds(p, invoice) == []
    assert _rows(p.database_url, "SELECT count(*) FROM audit_event WHERE operation_id = %s "
                 "AND type = 'approval.narrowed'", str(op)) == [(0,)]


def test_the_cli_narrows_through_the_console(world: Pipeline) -> None:
    # `agentledger approvals narrow` speaks to the same JSON API with the approver's token.
    p = world
    op, invoice, approval_id, _ = _pending(p, 60_000)
    token = _as(p, "user:frank", ["finance-approver"])["Authorization"].removeprefix("Bearer ")
    ran = CliRunner().invoke(cli.app, [
        "approvals", "narrow", approval_id, "--url", str(p.console_url), "--token", token,
        "--set", "amount_minor=45000", "--reason", "half of the damage", "--yes"])
    assert ran.exit_code == 0, ran.output
    assert "narrowed" in ran.output and "approved" in ran.output, ran.output
    p.wait_state(op, "succeeded")
    assert _refunds(p, invoice) == [(45_000, "EUR")]
    [(_, original_state, _), (_, narrowed_state, narrowed_from)] = _ledger(p, op)
    assert (original_state, narrowed_state, narrowed_from) == ("narrowed", "approved",
                                                               approval_id)
    # A widening through the CLI is the API's refusal, exit 2, and changes nothing.
    op, invoice, approval_id, _ = _pending(p, 60_000)
    ran = CliRunner().invoke(cli.app, [
        "approvals", "narrow", approval_id, "--url", str(p.console_url), "--token", token,
        "--set", "amount_minor=61000", "--yes"])
    assert ran.exit_code == 2 and "narrowing_refused" in ran.output, ran.output
    assert _ledger(p, op) == [(approval_id, "pending", None)]
