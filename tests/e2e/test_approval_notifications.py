"""A 600 EUR refund under a 2-of-3 rule, notified to its three approvers, end to end (issue 42).

Every service a process (admission with the v2 approval file, the console, the notifier,
relay, executors, reconciler, the billing stand-in), a real Mailpit and a webhook receiver
in this test: each approver is told once per key by webhook and by e-mail, the link opens the
request in the console, one approval runs nothing, the second runs the refund exactly once.
Undecided past its window, a request is escalated to the leads once; expired, both groups are
told and nothing runs. Time moves as the approval tests move it: the request's own
timestamps in the database (the processes run on the real clock; nothing sleeps).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg2
import pytest

from agentledger.notify import outbox
from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests import mailpit, notify_world, webhook_receiver
from tests.notify_world import FINANCE, REFUND
from tests.stack import Stack


@pytest.fixture(scope="module")
def receiver() -> Iterator[webhook_receiver.Receiver]:
    with webhook_receiver.running() as found:
        yield found


@pytest.fixture(scope="module")
def mail() -> Iterator[mailpit.Mailpit]:
    with mailpit.running() as found:
        yield found


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory, receiver: webhook_receiver.Receiver,
          mail: mailpit.Mailpit) -> Iterator[Pipeline]:
    config = tmp_path_factory.mktemp("config")
    (config / "approvals.json").write_text(json.dumps(notify_world.document(
        hook_url=receiver.url, smtp_port=mail.smtp_port, escalate_after=1800)))
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("notify"), console=True, notifier=True,
                  config_env={"AGENTLEDGER_APPROVALS": str(config / "approvals.json"),
                              notify_world.SECRET_ENV: notify_world.SECRET}) as p:
        asyncio.run(identities.put_principals(
            database_url, p.tenant,
            {m: ["finance-approver"] for m in (*FINANCE[1:], *notify_world.LEADS)}
            # The requester holds the approver role too: only the requester rule refuses her.
            | {"user:alice": ["user", "finance-approver"]}))
        yield p


def _rows(url: str, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(url)
    conn.autocommit = True  # the tests' UPDATEs move a request's time: committed at once
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_three_approvers_are_told_once_per_key_and_two_run_the_refund_once(
        world: Pipeline, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    p = world
    assert p.sessions is not None and p.console_url
    invoice = f"inv-n-{uuid.uuid4().hex[:8]}"
    op = p.propose(REFUND, {"invoice_id": invoice, "amount_minor": 60_000, "currency": "EUR",
                            "reason": "damaged in transit"})
    assert wait_until(lambda: p.pending_approval(op), timeout=60)
    [(approval_id,)] = _rows(p.database_url, "SELECT approval_id FROM approval_request "
                                             "WHERE operation_id = %s", str(op))
    aid = uuid.UUID(str(approval_id))
    hooks = {m: outbox.key(aid, m, "hook", "requested") for m in FINANCE}
    mails = {m: outbox.key(aid, m, "mail", "requested") for m in FINANCE}

    def all_sent() -> bool:
        return _rows(p.database_url, "SELECT count(*) FROM approval_notification WHERE "
                     "approval_id = %s AND state = 'sent'", str(aid)) == [(6,)]

    assert wait_until(all_sent, timeout=60), p.services["notifier"].tail()
    mine = {k: v for k, v in receiver.by_key().items() if k in hooks.values()}
    # Each approver's webhook got exactly its notification, once, signed, keyed.
    assert {k: len(v) for k, v in mine.items()} == {k: 1 for k in hooks.values()}
    for member, key in hooks.items():
        [delivery] = mine[key]
        assert delivery.path == "/" + member[5:]
        assert delivery.signed_by(notify_world.SECRET.encode())
        assert delivery.document()["recipient"] == member
    for member, key in mails.items():
        def stored(key: str = key) -> bool:
            return bool(mail.messages(f"{key}@{notify_world.DOMAIN}"))
        assert wait_until(stored, timeout=30)
        [message] = mail.messages(f"{key}@{notify_world.DOMAIN}")
        assert message["To"][0]["Address"] == f"{member[5:]}@finance.invalid"

    # The link opens exactly this request in the console.
    link = mine[hooks["user:fiona"]][0].document()["link"]
    assert link == f"{p.console_url}/approvals/{aid}"
    token = p.sessions.issue(p.tenant, "user:fiona", ["finance-approver"])
    page = httpx.get(link, cookies={"agentledger_console": token}, timeout=30,
                     follow_redirects=False)
    assert page.status_code == 200, page.text[:500]
    [(request_hash,)] = _rows(p.database_url, "SELECT encode(request_hash, 'hex') FROM "
                                              "approval_request WHERE approval_id = %s", str(aid))
    assert str(request_hash) in page.text and REFUND in page.text

    def approve(principal: str, roles: list[str]) -> httpx.Response:
        assert p.sessions is not None
        return httpx.post(
            f"{p.console_url}/api/v1/approvals/{aid}/approve",
            json={"shown_hash": request_hash, "reason": "invoice checked"}, timeout=30,
            headers={"Authorization": "Bearer " + p.sessions.issue(p.tenant, principal, roles)})

    # alice holds finance-approver in the directory (the fixture): only the requester rule
    # refuses her (the console words every policy refusal alike).
    own = approve("user:alice", ["user", "finance-approver"])
    assert own.status_code == 403 and own.json()["error"]["code"] == "not_permitted", own.text
    first = approve("user:fiona", ["finance-approver"])
    assert first.status_code == 200 and first.json()["state"] == "pending", first.text
    assert p.state(op) is None
    second = approve("user:frank", ["finance-approver"])
    assert second.status_code == 200 and second.json()["state"] == "approved", second.text
    p.wait_state(op, "succeeded")
    assert _rows(p.crm.database_url, "SELECT count(*) FROM crm_refund WHERE tenant_id = %s "
                 "AND invoice_id = %s", p.tenant, invoice) == [(1,)]
    # Nothing was notified twice meanwhile.
    assert {k: len(v) for k, v in receiver.by_key().items() if k in hooks.values()} == {
        k: 1 for k in hooks.values()}


def _count(p: Pipeline, sql: str, *args: object) -> int:
    [(n,)] = _rows(p.database_url, sql, *args)
    return int(str(n))


def test_undecided_it_is_escalated_once_then_expired_and_nothing_runs(
        world: Pipeline, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    p = world
    assert p.sessions is not None and p.console_url
    invoice = f"inv-e-{uuid.uuid4().hex[:8]}"
    op = p.propose(REFUND, {"invoice_id": invoice, "amount_minor": 60_000, "currency": "EUR",
                            "reason": "damaged in transit"})
    assert wait_until(lambda: p.pending_approval(op), timeout=60)
    [(approval_id,)] = _rows(p.database_url, "SELECT approval_id FROM approval_request "
                                             "WHERE operation_id = %s", str(op))
    aid = str(approval_id)

    def sent(kind: str) -> int:
        return _count(p, "SELECT count(*) FROM approval_notification WHERE approval_id = %s "
                      "AND kind = %s AND state = 'sent'", aid, kind)

    assert wait_until(lambda: sent("requested") == 6, timeout=60)
    assert sent("escalated") == 0  # inside its 30-minute window

    # The window passes (the request's creation moved back past it, as the approval tests
    # move an expiry): the notifier escalates it to the leads, who are told by e-mail.
    _rows(p.database_url, "UPDATE approval_request SET created_at = created_at - "
                          "interval '31 minutes' WHERE approval_id = %s RETURNING 1", aid)
    assert wait_until(lambda: sent("escalated") == 2, timeout=60), p.services["notifier"].tail()
    leads = {m: outbox.key(uuid.UUID(aid), m, "mail", "escalated") for m in notify_world.LEADS}
    for member, key in leads.items():
        def stored(key: str = key) -> bool:
            return bool(mail.messages(f"{key}@{notify_world.DOMAIN}"))
        assert wait_until(stored, timeout=30)
        [message] = mail.messages(f"{key}@{notify_world.DOMAIN}")
        assert message["To"][0]["Address"] == f"{member[5:]}@leads.invalid"

    # Its expiry passes: the reconciler expires it, the notifier tells both groups.
    _rows(p.database_url, "UPDATE approval_request SET expires_at = now() - interval '1 second'"
                          " WHERE approval_id = %s RETURNING 1", aid)
    assert wait_until(lambda: sent("expired") == 8, timeout=60), p.services["notifier"].tail()
    # Escalated once, though the notifier swept many times since (the expiry notices are the
    # positive marker that it did).
    assert _count(p, "SELECT count(*) FROM approval_notification WHERE approval_id = %s AND "
                  "kind = 'escalated'", aid) == 2
    assert _count(p, "SELECT count(*) FROM audit_event WHERE operation_id = %s AND "
                  "type = 'approval.escalated'", str(op)) == 1
    assert _count(p, "SELECT count(*) FROM audit_event WHERE operation_id = %s AND "
                  "type = 'approval.expired'", str(op)) == 1
    for key in leads.values():
        assert len(mail.messages(f"{key}@{notify_world.DOMAIN}")) == 1

    # Nothing runs: a lead's late approval is refused, no command, no refund.
    [(request_hash,)] = _rows(p.database_url, "SELECT encode(request_hash, 'hex') FROM "
                                              "approval_request WHERE approval_id = %s", aid)
    late = httpx.post(
        f"{p.console_url}/api/v1/approvals/{aid}/approve",
        json={"shown_hash": request_hash, "reason": "too late"}, timeout=30,
        headers={"Authorization": "Bearer " + p.sessions.issue(
            p.tenant, "user:lena", ["finance-approver"])})
    assert late.status_code in (409, 410), late.text
    assert p.state(op) is None
    assert _rows(p.crm.database_url, "SELECT count(*) FROM crm_refund WHERE tenant_id = %s "
                 "AND invoice_id = %s", p.tenant, invoice) == [(0,)]
