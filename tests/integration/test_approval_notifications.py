"""Notifications of pending approvals (issue 42 item 1), on real Postgres, a real Mailpit and
a real webhook receiver: rows written with the request, delivered once per key by the
notifier (signed webhook, e-mail with Message-ID = key), the same key on redelivery, retries
with backoff then ``failed`` with an audit event, a killed worker's lease taken over."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentledger.approvals import quorum
from agentledger.approvals import repository as approvals
from agentledger.contracts.proposals import ProposalV1
from agentledger.notify import conformance, outbox, plugins, worker
from agentledger.notify import email as email_plugin
from agentledger.policy import repository as policy_repo
from agentledger.services.notifier import app as notifier_app
from tests import mailpit, notify_world, webhook_receiver
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World
from tests.notify_world import FINANCE

crm, world = executor_world.fixtures()


@pytest.fixture
def database_url(make_database: Callable[[], str]) -> str:
    """A database per test: the notifier claims across tenants, so counts are this test's."""
    return make_database()


@pytest.fixture(scope="module")
def mail() -> Iterator[mailpit.Mailpit]:
    with mailpit.running() as found:
        yield found


@pytest.fixture
def receiver() -> Iterator[webhook_receiver.Receiver]:
    with webhook_receiver.running() as found:
        yield found


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notify_world.SECRET_ENV, notify_world.SECRET)


@pytest.fixture
async def notifier_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async def init(conn: asyncpg.Connection) -> None:
        await conn.execute("SET ROLE agentledger_notifier")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4, init=init)
    yield pool
    await pool.close()


class Clock:
    """The notifier's clock seam: tests move it instead of sleeping."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _rules(receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> quorum.ApprovalRules:
    return quorum.ApprovalRules.parse(notify_world.document(hook_url=receiver.url,
                                                            smtp_port=mail.smtp_port))


async def _pending(w: World, t: Tenant, rules: quorum.ApprovalRules) -> approvals.Approval:
    async with w.owner.acquire() as conn:
        for member in FINANCE[1:]:
            await policy_repo.put_principal(conn, t.tenant_id, member, ["finance-approver"])
    admitter = w.admitter()
    admitter.approval_rules = rules
    op = uuid.uuid4()
    result = await admitter.admit(ProposalV1.model_validate({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": notify_world.REFUND, "target": t.customer_id, "planner": {"name": "scripted"},
        "arguments": {"customer_id": t.customer_id, "invoice_id": f"inv-{op.hex[:8]}",
                      "amount_minor": 60_000, "currency": "EUR", "reason": "damaged"},
        "created_at": datetime.now(UTC).isoformat()}))
    assert result.status == "pending_approval" and result.approval_id is not None, result
    async with w.admission_pool.acquire() as conn:
        return await approvals.get(conn, t.tenant_id, result.approval_id)


_OPEN: list[worker.Notifier] = []


@pytest.fixture(autouse=True)
async def _close_channels() -> AsyncIterator[None]:
    yield
    while _OPEN:
        for channel in _OPEN.pop().channels.values():
            await channel.aclose()


def _notifier(pool: asyncpg.Pool, rules: quorum.ApprovalRules, clock: Clock, *,
              worker_id: str = "notifier-1", max_attempts: int = 5) -> worker.Notifier:
    built = _built(pool, rules, clock, worker_id, max_attempts)
    _OPEN.append(built)
    return built


def _built(pool: asyncpg.Pool, rules: quorum.ApprovalRules, clock: Clock, worker_id: str,
           max_attempts: int) -> worker.Notifier:
    return worker.Notifier(
        pool=pool, channels=notifier_app.channels(rules),
        plugin_of={n: c.plugin for n, c in rules.channels.items()},
        console_url="http://console.test:8070", worker_id=worker_id,
        lease=timedelta(seconds=45), max_attempts=max_attempts, clock=clock)


async def _rows(w: World, approval_id: uuid.UUID) -> list[dict[str, object]]:
    async with w.owner.acquire() as conn:
        return [dict(r) for r in await conn.fetch(
            "SELECT * FROM approval_notification WHERE approval_id = $1 "
            "ORDER BY recipient, channel", approval_id)]


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return await check()


async def test_a_pending_request_writes_one_row_per_member_and_channel_with_it(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    rows = await _rows(world, request.approval_id)
    assert [(r["recipient"], r["channel"], r["kind"], r["state"]) for r in rows] == [
        (m, c, "requested", "pending") for m in sorted(FINANCE) for c in ("hook", "mail")]
    for r in rows:  # the key is derived, never random: a redelivery carries the same one
        assert r["idempotency_key"] == outbox.key(request.approval_id, str(r["recipient"]),
                                                  str(r["channel"]), "requested")
    assert {r["address"] for r in rows if r["channel"] == "hook"} == {
        f"{receiver.url}/{m[5:]}" for m in FINANCE}


async def test_the_rows_commit_with_the_request_or_not_at_all(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    t = await world.tenant()
    router = outbox.Router.of(_rules(receiver, mail))
    assert router is not None
    written: list[uuid.UUID] = []

    async def route_then_fail(tx: object, a: approvals.Approval) -> None:
        await router.requested(tx, a)  # type: ignore[arg-type]
        written.append(a.approval_id)
        raise RuntimeError("the transaction dies after the notifications were written")

    original = approvals.request

    async def failing(conn: object, new: approvals.NewApproval, **kw: object) -> object:
        return await original(conn, new, **{**kw, "routed": route_then_fail})  # type: ignore[arg-type]

    admitter = world.admitter()
    admitter.approval_rules = router.rules
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(approvals, "request", failing)
        with pytest.raises(RuntimeError):
            await _pending(world, t, router.rules)
    assert written, "the routed hook ran"
    async with world.owner.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM approval_request WHERE approval_id = $1",
                                   written[0]) == 0
    assert await _rows(world, written[0]) == []


async def test_the_notifier_delivers_each_notification_once_per_key(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    notifier = _notifier(notifier_pool, rules, clock)
    assert await notifier.run_once() >= 6
    rows = await _rows(world, request.approval_id)
    assert {r["state"] for r in rows} == {"sent"}
    keys = {str(r["recipient"]): str(r["idempotency_key"]) for r in rows if r["channel"] == "hook"}
    mine = [d for d in receiver.seen() if d.document()["approval_id"] == str(request.approval_id)]
    assert sorted(d.key for d in mine) == sorted(keys.values())
    for d in mine:
        doc = d.document()
        assert d.signed_by(notify_world.SECRET.encode())
        assert not d.signed_by(b"another-secret-of-enough-length")
        assert d.path == "/" + doc["recipient"][5:]
        assert keys[doc["recipient"]] == d.key == doc["key"]
        assert doc["link"] == f"http://console.test:8070/approvals/{request.approval_id}"
        assert (doc["kind"], doc["action"], doc["required_approvals"]) == (
            "requested", notify_world.REFUND, 2)
    mail_keys = [str(r["idempotency_key"]) for r in rows if r["channel"] == "mail"]
    assert len(mail_keys) == 3
    for k in mail_keys:  # Mailpit stores a message after it answered: poll, then exactly one
        async def stored(k: str = k) -> bool:
            return len(await asyncio.to_thread(mail.messages, f"{k}@{notify_world.DOMAIN}")) > 0
        assert await _eventually(stored)
        [message] = mail.messages(f"{k}@{notify_world.DOMAIN}")
        assert message["To"][0]["Address"].endswith("@finance.invalid")
    # Nothing more is due: a second pass sends nothing.
    assert await notifier.run_once() == 0
    assert len(receiver.seen()) == len(mine)

    # A redelivery (the row made due again, as after a worker died before its mark) carries
    # the same key: a receiver that dedupes by it still has one per key.
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE approval_notification SET state = 'pending', "
                           "lease_owner = 'dead', next_attempt_at = $2 WHERE approval_id = $1",
                           request.approval_id, clock.now + timedelta(seconds=45))
    assert await notifier.run_once() == 0  # the dead worker's lease holds
    clock.now += timedelta(seconds=46)
    assert await notifier.run_once() == 6
    assert len(receiver.seen()) == 2 * len(mine)
    assert set(receiver.by_key()) == set(keys.values())
    assert all(len(v) == 2 for v in receiver.by_key().values())
    for k in mail_keys:
        assert len(mail.messages(f"{k}@{notify_world.DOMAIN}")) >= 1


async def test_retries_back_off_and_stop_failed_with_an_audit_event(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    receiver.script["/fred"] = [503]  # always unavailable: retried, then failed
    receiver.script["/frank"] = [410]  # gone: permanent at once
    request = await _pending(world, t, rules)
    clock = Clock()
    notifier = _notifier(notifier_pool, rules, clock, max_attempts=3)
    await notifier.run_once()
    by = {(r["recipient"], r["channel"]): r for r in await _rows(world, request.approval_id)}
    assert by[("user:frank", "hook")]["state"] == "failed"
    fred = by[("user:fred", "hook")]
    assert (fred["state"], fred["attempts"], fred["last_error"]) == ("pending", 1, "HTTP 503")
    # Backed off: not due again until the backoff has passed on the notifier's clock.
    assert fred["next_attempt_at"] > clock.now  # type: ignore[operator]
    assert await notifier.run_once() == 0
    for attempt in (2, 3):
        clock.now += worker.backoff(attempt - 1) * 1.3
        assert await notifier.run_once() == 1
    fred = {(r["recipient"], r["channel"]): r for r in await _rows(world, request.approval_id)
            }[("user:fred", "hook")]
    assert (fred["state"], fred["attempts"]) == ("failed", 3)
    assert len([d for d in receiver.seen() if d.path == "/fred"]) == 3
    clock.now += timedelta(hours=1)
    assert await notifier.run_once() == 0  # bounded: never tried again
    async with world.owner.acquire() as conn:
        failed = [json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"]
                  for r in await conn.fetch(
                      "SELECT payload FROM audit_event WHERE operation_id = $1 AND "
                      "type = 'approval.notification_failed' ORDER BY seq",
                      request.operation_id)]
    assert sorted((f["recipient"], f["attempts"]) for f in failed) == [
        ("user:frank", 1), ("user:fred", 3)]


async def test_a_dead_workers_lease_is_taken_over_with_the_same_keys(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    # Worker 1 claims, then dies without sending. It had the same worker id as the survivor
    # (replicas that share a configured id): each claim's own lease token still tells them apart.
    async with notifier_pool.acquire() as conn:
        taken = await outbox.claim(conn, worker="notifier-2", now=clock.now,
                                   lease=timedelta(seconds=45), limit=100)
    assert {c.approval_id for c in taken} >= {request.approval_id}
    other = _notifier(notifier_pool, rules, clock, worker_id="notifier-2")
    assert await other.run_once() == 0  # leased: not yet
    clock.now += timedelta(seconds=46)
    assert await other.run_once() >= 6
    rows = await _rows(world, request.approval_id)
    assert {r["state"] for r in rows} == {"sent"}
    assert {r["attempts"] for r in rows} == {2}
    # The dead worker's late mark does not count: the row is the new holder's.
    mine = next(c for c in taken if c.approval_id == request.approval_id)
    async with notifier_pool.acquire() as conn:
        assert not await outbox.mark_sent(conn, mine, now=clock.now)
        assert not await outbox.mark_failed(conn, mine, error="late")
    assert {r["state"] for r in await _rows(world, request.approval_id)} == {"sent"}


class _Raising:
    """A third-party plugin that raises instead of answering a Delivery."""

    async def send(self, notification: plugins.Notification) -> plugins.Delivery:
        raise RuntimeError("the plugin's own bug")

    async def aclose(self) -> None:
        return None


async def test_a_plugin_that_raises_is_a_failed_attempt_within_the_bound(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    notifier = worker.Notifier(
        pool=notifier_pool, channels={"hook": _Raising(), "mail": _Raising()},  # type: ignore[dict-item]
        plugin_of={"hook": "webhook", "mail": "email"}, console_url="http://console.test",
        worker_id="notifier-1", max_attempts=2, clock=clock)
    assert await notifier.run_once() == 6  # no exception escapes the worker
    rows = await _rows(world, request.approval_id)
    assert {(r["state"], r["attempts"], r["last_error"]) for r in rows} == {
        ("pending", 1, "the plugin raised RuntimeError")}
    clock.now += timedelta(hours=1)
    assert await notifier.run_once() == 6
    assert {(r["state"], r["attempts"]) for r in await _rows(world, request.approval_id)} == {
        ("failed", 2)}
    clock.now += timedelta(hours=1)
    assert await notifier.run_once() == 0  # bounded: never claimed again


async def test_a_row_claimed_past_its_attempts_is_failed_without_a_send(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    """A worker killed mid-send every time never settles an attempt: the claim that passes
    the bound fails the row instead of sending once more."""
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE approval_notification SET attempts = 3 "
                           "WHERE approval_id = $1", request.approval_id)
    notifier = _notifier(notifier_pool, rules, clock, max_attempts=3)
    assert await notifier.run_once() == 6
    rows = await _rows(world, request.approval_id)
    assert {(r["state"], r["attempts"], r["last_error"]) for r in rows} == {
        ("failed", 4, "3 attempts never settled")}
    assert receiver.seen() == []


@pytest.mark.parametrize("plugin", ["webhook", "email"])
async def test_the_shipped_plugins_keep_the_key_on_redelivery(
        plugin: str, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit) -> None:
    rules = _rules(receiver, mail)
    channel = rules.channels["hook" if plugin == "webhook" else "mail"]
    notifier = plugins.make(channel.plugin, channel.options)
    approval_id = uuid.uuid4()
    sample = plugins.Notification(
        key=outbox.key(approval_id, "user:fiona", "x", "requested"), kind="requested",
        tenant_id=uuid.uuid4(), approval_id=approval_id, operation_id=uuid.uuid4(),
        action=notify_world.REFUND, group="finance", recipient="user:fiona",
        address=f"{receiver.url}/fiona" if plugin == "webhook" else "fiona@finance.invalid",
        link=outbox.link("http://console.test", approval_id), required_approvals=2,
        expires_at=datetime.now(UTC) + timedelta(hours=1))

    async def seen(key: str) -> int:
        if plugin == "webhook":
            return len(receiver.by_key().get(key, []))
        assert isinstance(notifier, email_plugin.EmailNotifier)
        return len(await asyncio.to_thread(mail.messages, notifier.message_id(key)))

    try:
        findings = await conformance.check(notifier, sample, seen, _eventually)
    finally:
        await notifier.aclose()
    assert [(f.claim, f.holds) for f in findings] == [
        ("delivers", True), ("same_key_on_redelivery", True), ("distinct_keys", True)], findings


# ---------------------------------------------------------------- escalation and expiry (item 3)

def _escalating(receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit
                ) -> quorum.ApprovalRules:
    return quorum.ApprovalRules.parse(notify_world.document(
        hook_url=receiver.url, smtp_port=mail.smtp_port, escalate_after=1800))


async def _leads(w: World, t: Tenant) -> None:
    async with w.owner.acquire() as conn:
        for member in notify_world.LEADS:
            await policy_repo.put_principal(conn, t.tenant_id, member, ["finance-approver"])


async def _audited(w: World, op: uuid.UUID) -> list[str]:
    async with w.owner.acquire() as conn:
        return [r["type"] for r in await conn.fetch(
            "SELECT type FROM audit_event WHERE operation_id = $1 AND type LIKE 'approval.%' "
            "ORDER BY seq", op)]


async def _decide(w: World, t: Tenant, approval_id: uuid.UUID, approver: str, *,
                  approve: bool = True) -> tuple[approvals.Approval, object]:
    from agentledger.approvals import rules as approval_rules
    from agentledger.ledger import keys
    from tests.integration.executor_world import RULES

    async def no_revision(_: approvals.Approval) -> str | None:
        return None

    async with w.admission_pool.acquire() as conn:
        pending = await approvals.get(conn, t.tenant_id, approval_id)
        return await approval_rules.decide(
            conn, authorizer=w.authorizer, allowlist=RULES, cipher=keys.PayloadCipher(w.master),
            revision=no_revision, tenant_id=t.tenant_id, approver_id=approver,
            approval_id=approval_id, approve=approve, shown_hash=pending.hash_hex,
            reason="checked")


async def test_an_undecided_request_is_escalated_once_and_the_leads_may_decide_it(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    await _leads(world, t)
    rules = _escalating(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    notifier = _notifier(notifier_pool, rules, clock)
    notifier.router = outbox.Router.of(rules)
    assert await notifier.sweep() == 0  # inside the window: nothing
    assert await notifier.run_once() == 6

    clock.now += timedelta(seconds=1801)  # the seam: the window has passed
    # Two notifiers sweeping at once escalate it once (the conditional update).
    other = _notifier(notifier_pool, rules, clock, worker_id="notifier-2")
    other.router = notifier.router
    assert sorted(await asyncio.gather(notifier.sweep(), other.sweep())) == [0, 1]
    assert await notifier.sweep() == 0
    async with world.owner.acquire() as conn:
        row = await conn.fetchrow("SELECT escalated_at, escalated_to, state FROM "
                                  "approval_request WHERE approval_id = $1", request.approval_id)
    assert (row["escalated_to"], row["state"]) == ("leads", "pending")
    assert row["escalated_at"] == clock.now
    escalated = [r for r in await _rows(world, request.approval_id) if r["kind"] == "escalated"]
    assert sorted((r["recipient"], r["channel"]) for r in escalated) == [
        ("user:lena", "mail"), ("user:leo", "mail")]
    assert await notifier.run_once() == 2
    for r in escalated:
        key = str(r["idempotency_key"])

        async def stored(key: str = key) -> bool:
            return bool(await asyncio.to_thread(mail.messages, f"{key}@{notify_world.DOMAIN}"))
        assert await _eventually(stored)
        [message] = mail.messages(f"{key}@{notify_world.DOMAIN}")
        assert message["Subject"].startswith("Approval escalated to you")
    assert (await _audited(world, request.operation_id)).count("approval.escalated") == 1

    # The escalated group's members decide: lena's and leo's approvals reach the quorum of 2.
    first, admitted = await _decide(world, t, request.approval_id, "user:lena")
    assert (first.state, admitted) == ("pending", None)
    second, admitted = await _decide(world, t, request.approval_id, "user:leo")
    assert second.state == "approved" and admitted is not None
    begun = await world.dispatcher().begin(t.tenant_id, request.operation_id)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "succeeded"
    assert len(await world.effects(t, "refund.created")) == 1
    # Decided: later sweeps neither escalate nor announce it.
    clock.now += timedelta(days=2)
    assert await notifier.sweep() == 0


async def test_after_expiry_both_groups_are_told_and_nothing_runs(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    await _leads(world, t)
    rules = _escalating(receiver, mail)
    request = await _pending(world, t, rules)
    clock = Clock()
    notifier = _notifier(notifier_pool, rules, clock)
    notifier.router = outbox.Router.of(rules)
    clock.now += timedelta(seconds=1801)
    assert await notifier.sweep() == 1  # escalated
    # Expiry follows the database's clock, as the existing approval tests move it.
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE approval_request SET expires_at = now() - interval '1 second'"
                           " WHERE approval_id = $1", request.approval_id)
    async with world.reconciler_pool.acquire() as conn:
        expired = await approvals.expire_due(conn)
    assert (t.tenant_id, request.approval_id) in expired
    assert await notifier.sweep() == 1  # the expiry announced
    assert await notifier.sweep() == 0  # once
    notices = [r for r in await _rows(world, request.approval_id) if r["kind"] == "expired"]
    assert sorted((r["recipient"], r["channel"]) for r in notices) == sorted(
        [(m, c) for m in FINANCE for c in ("hook", "mail")]
        + [(m, "mail") for m in notify_world.LEADS])
    await notifier.run_once()
    # The request and escalation notices never went out before it expired: not sent now
    # (nobody is asked to decide a closed request); the expiry notices are.
    assert {(r["kind"], r["state"]) for r in await _rows(world, request.approval_id)} == {
        ("requested", "cancelled"), ("escalated", "cancelled"), ("expired", "sent")}
    told = [d for d in receiver.seen() if d.document()["approval_id"] == str(request.approval_id)
            and d.document()["kind"] == "expired"]
    assert sorted(d.document()["recipient"] for d in told) == sorted(FINANCE)
    assert (await _audited(world, request.operation_id))[-2:] == [
        "approval.escalated", "approval.expired"]
    # Nothing runs: a late approval is refused, no command was admitted, no provider effect.
    from agentledger import errors
    with pytest.raises(errors.AgentLedgerError):
        await _decide(world, t, request.approval_id, "user:lena")
    async with world.owner.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_command WHERE operation_id = $1",
                                   request.operation_id) == 0
    assert await world.effects(t, "refund.created") == []


async def test_a_request_decided_before_its_notices_went_out_is_not_announced(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    denied, _ = await _decide(world, t, request.approval_id, "user:fiona", approve=False)
    assert denied.state == "denied"
    notifier = _notifier(notifier_pool, rules, Clock())
    assert await notifier.run_once() == 6
    rows = await _rows(world, request.approval_id)
    assert {(r["state"], r["last_error"]) for r in rows} == {
        ("cancelled", "the request is denied")}
    assert receiver.seen() == []
    for r in rows:  # and nothing reached Mailpit under any of its keys
        assert mail.messages(f"{r['idempotency_key']}@{notify_world.DOMAIN}") == []


async def test_a_narrowed_request_that_still_needs_votes_is_announced_with_it(
        world: World, receiver: webhook_receiver.Receiver, mail: mailpit.Mailpit,
        notifier_pool: asyncpg.Pool) -> None:
    """Issue 42 items 1 and 4 together: frank narrows 600 to 550 (still above 500: two
    approvers), so the narrowed request is a new pending request with its own id and hash —
    its notices are written in the narrowing's transaction, and the original's, never sent,
    are cancelled rather than asking anyone to decide a closed request."""
    from agentledger.approvals import narrowing
    from agentledger.budgets import rules as budget_rules
    from agentledger.ledger import keys
    from tests.integration.executor_world import RULES

    async def no_revision(_: approvals.Approval) -> str | None:
        return None

    t = await world.tenant()
    rules = _rules(receiver, mail)
    request = await _pending(world, t, rules)
    router = outbox.Router.of(rules)
    assert router is not None
    arguments = {**await approval_args(world, t, request), "amount_minor": 55_000}
    async with world.admission_pool.acquire() as conn:
        done = await narrowing.narrow(
            conn, authorizer=world.authorizer, allowlist=RULES,
            cipher=keys.PayloadCipher(world.master), revision=no_revision,
            approval_rules=rules, budgets=budget_rules.Budgets(), tenant_id=t.tenant_id,
            approver_id="user:frank", approval_id=request.approval_id,
            shown_hash=request.hash_hex, arguments=arguments, reason="partial refund",
            routed=router.requested)
    assert (done.narrowed.state, done.narrowed.required_approvals) == ("pending", 2)
    narrowed_rows = await _rows(world, done.narrowed.approval_id)
    assert [(r["recipient"], r["channel"], r["kind"], r["state"]) for r in narrowed_rows] == [
        (m, c, "requested", "pending") for m in sorted(FINANCE) for c in ("hook", "mail")]
    assert {r["idempotency_key"] for r in narrowed_rows}.isdisjoint(
        {r["idempotency_key"] for r in await _rows(world, request.approval_id)})
    notifier = _notifier(notifier_pool, rules, Clock())
    assert await notifier.run_once() == 12
    assert {r["state"] for r in await _rows(world, request.approval_id)} == {"cancelled"}
    assert {r["state"] for r in await _rows(world, done.narrowed.approval_id)} == {"sent"}
    # The receiver saw the narrowed request's three webhooks, none of the original's.
    seen = receiver.seen()
    assert sorted(d.document()["approval_id"] for d in seen) == [
        str(done.narrowed.approval_id)] * 3


async def approval_args(w: World, t: Tenant, a: approvals.Approval) -> dict[str, object]:
    """The original's proposed arguments, decrypted as the console reads them."""
    from agentledger.approvals import rules as approval_rules
    from agentledger.ledger import keys

    async with w.admission_pool.acquire() as conn:
        got = await approval_rules.arguments(conn, keys.PayloadCipher(w.master), a)
    assert got is not None
    return dict(got)
