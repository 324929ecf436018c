"""The notifier SIGKILLed between a send and its mark (fault point ``notifier.after_send``),
restarted: every notification is delivered, each redelivery under the same key, so a
receiver that dedupes by the key sees each once (issue 42)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator

import psycopg2
import pytest

from agentledger.notify import outbox
from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests import mailpit, notify_world, webhook_receiver
from tests.chaos import harness
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
def notified(stack: Stack, database_url: str, make_database: Callable[[], str],
             tmp_path_factory: pytest.TempPathFactory, receiver: webhook_receiver.Receiver,
             mail: mailpit.Mailpit) -> Iterator[Pipeline]:
    config = tmp_path_factory.mktemp("config")
    (config / "approvals.json").write_text(json.dumps(notify_world.document(
        hook_url=receiver.url, smtp_port=mail.smtp_port)))
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("chaos-notify"), notifier=True,
                  env={**harness.CHAOS_ENV, "notifier": {"AGENTLEDGER_NOTIFIER_LEASE_S": "5"}},
                  config_env={"AGENTLEDGER_APPROVALS": str(config / "approvals.json"),
                              notify_world.SECRET_ENV: notify_world.SECRET}) as p:
        asyncio.run(identities.put_principals(
            database_url, p.tenant, {m: ["finance-approver"] for m in FINANCE[1:]}))
        yield p


def _states(p: Pipeline, approval_id: uuid.UUID) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT idempotency_key, channel, state FROM approval_notification "
                        "WHERE approval_id = %s ORDER BY idempotency_key", (str(approval_id),))
            return list(cur.fetchall())
    finally:
        conn.close()


def test_kill_notifier_after_send_before_mark_delivers_each_key(
        notified: Pipeline, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    p = notified
    harness.restart(p, "notifier", "notifier.after_send:kill:1")
    op = p.propose(REFUND, {"invoice_id": f"inv-k-{uuid.uuid4().hex[:8]}",
                            "amount_minor": 60_000, "currency": "EUR", "reason": "chaos"})
    assert wait_until(lambda: p.pending_approval(op), timeout=60)
    harness.wait_killed(p, "notifier")
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT approval_id FROM approval_request WHERE operation_id = %s",
                        (str(op),))
            row = cur.fetchone()
    finally:
        conn.close()
    assert row is not None
    aid = uuid.UUID(str(row[0]))
    # Killed after a receiver accepted one, before any mark: nothing is marked sent yet.
    assert {s for _, _, s in _states(p, aid)} == {"pending"}

    def delivered() -> int:  # what the receiver and Mailpit hold (Mailpit stores after its 250)
        return len(receiver.seen()) + sum(len(mail.messages(
            f"{outbox.key(aid, m, 'mail', 'requested')}@{notify_world.DOMAIN}")) for m in FINANCE)

    assert wait_until(lambda: delivered() >= 1, timeout=30)  # the send the kill followed

    harness.restart(p, "notifier", None)
    assert wait_until(lambda: {s for _, _, s in _states(p, aid)} == {"sent"}, timeout=60), (
        p.services["notifier"].tail())
    rows = _states(p, aid)
    hook_keys = {str(k) for k, c, _ in rows if c == "hook"}
    mail_keys = {str(k) for k, c, _ in rows if c == "mail"}
    assert hook_keys == {outbox.key(aid, m, "hook", "requested") for m in FINANCE}
    # The receiver, deduping by key, has each notification once; what it got twice (the
    # killed worker's send and the take-over's) came under the same key both times.
    by_key = receiver.by_key()
    assert set(by_key) == hook_keys
    for key, deliveries in by_key.items():
        assert {d.key for d in deliveries} == {key}
        assert {d.document()["key"] for d in deliveries} == {key}
    for key in mail_keys:
        def stored(key: str = key) -> bool:
            return bool(mail.messages(f"{key}@{notify_world.DOMAIN}"))
        assert wait_until(stored, timeout=30)
    # Six notifications, the one the kill followed delivered twice (or more) under its key
    # (Mailpit may store the second copy a moment after it answered: polled).
    assert len(rows) == 6
    assert wait_until(lambda: delivered() > 6, timeout=30), (receiver.by_key(), mail_keys)
