"""The soak's steady mixed load and its approver.

``Load`` proposes from one thread, as a client does: one long-lived idempotent producer
(acks=all) that waits for each acknowledgement however long a fault holds it. The mix:
notes (auto-approved), contact updates carrying the record's revision as If-Match (some
deliberately stale, so the CRM refuses the precondition and the command ends
``review_required``), refunds (billing, approval required; each on its own invoice id,
derived from the operation id, so the provider's refunds can be matched to commands).

``Approver`` decides every pending request through the real path (approver policy, shown
hash), approving most and denying some — each decision seeded by the operation id.
"""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from typing import Any

import asyncpg
import httpx
import psycopg2
from confluent_kafka import KafkaError, Producer

from agentledger import errors
from agentledger.approvals import repository as approvals
from agentledger.contracts import commands
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.testing.pipeline import Pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.soak.history import History
from tests.soak.worker import Worker

NOTE, CONTACT, REFUND = "crm.note.create", "crm.contact.update", "billing.refund.create"
# The mix, by weight: mostly notes (the hot path), enough of the others to exercise
# approvals, preconditions and a connector without idempotency every minute.
MIX = ((NOTE, 6), (CONTACT, 2), (REFUND, 2))
# Share of contact updates sent with a revision the record has already left behind.
STALE = 0.3
# Share of approval requests the approver denies.
DENY = 0.15
# Pace of the load: about 3 proposals/s on a 2-core box that also runs six JVMs, two
# PostgreSQL clusters and seven services (the soak measures correctness, not saturation).
PAUSE_S = 0.3
# How often the approver looks for pending requests (a person answers in seconds, not ms).
APPROVER_PERIOD_S = 1.0
APPROVER = "user:fiona"  # finance-approver: may approve contact updates and refunds alike


def invoice_of(op: uuid.UUID | str) -> str:
    """The invoice id the load refunds for ``op``: one refund per operation, recognisable."""
    return f"inv-{uuid.UUID(str(op)).hex}"


class Load(Worker):
    def __init__(self, p: Pipeline, history: History, seed: int,
                 rate: float | None = None) -> None:
        self.p, self.history = p, history
        # Proposals per second on a fixed schedule (the soak at load), sent without waiting
        # for each acknowledgement; None: one at a time, PAUSE_S apart (the default soak).
        self.rate = rate
        self.rng = random.Random(f"load:{seed}")
        self.errors: list[str] = []
        self._revisions: list[str] = []  # every revision of the record seen, oldest first
        Worker.__init__(self, "soak-load")

    def _run(self) -> None:
        # Destroyed only here, with nothing in flight (librdkafka #4605).
        producer = self.p.producer()
        if self.rate is not None:
            try:
                self._paced(producer)
            finally:
                producer.flush(30)
            return
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                action = self.rng.choices([a for a, _ in MIX], [w for _, w in MIX])[0]
                op = uuid.uuid4()
                try:
                    arguments, revision, facts = self._arguments(action, n, op)
                except httpx.HTTPError as exc:
                    # The record's revision could not be read (the provider is partitioned
                    # or down): an agent would not propose blind; the load goes on.
                    self.history.append("phase", name="load_skipped", action=action,
                                        error=repr(exc)[:200])
                    self._stop.wait(PAUSE_S)
                    continue
                _, record = self.p.proposal(action, arguments, operation_id=op,
                                            expected_revision=revision,
                                            envelope_ttl_s=harness.ENVELOPE_TTL_S)
                answer: list[KafkaError | None] = []

                def delivered(err: KafkaError | None, _msg: object,
                              answer: list[KafkaError | None] = answer) -> None:
                    answer.append(err)
                sent = self.history.now()
                producer.produce(**record, on_delivery=delivered)
                while not answer:
                    producer.poll(0.5)
                self.history.append("proposal", operation_id=str(op), action=action,
                                    facts=facts, sent_t=round(sent, 3),
                                    acked=answer[0] is None,
                                    error=None if answer[0] is None else str(answer[0]))
                self._stop.wait(PAUSE_S)  # the load's pace, not a wait for any condition
        except Exception as exc:  # reported in the soak's result, never swallowed
            self.errors.append(repr(exc))
            self.history.append("phase", name="load_failed", error=repr(exc))
        finally:
            producer.flush(30)

    def _paced(self, producer: Producer) -> None:
        """Proposals on a fixed schedule, ``rate`` per second: each is recorded when Kafka
        answers it (acknowledged or not); a producer queue filled by a broker outage holds
        the schedule back rather than dropping a proposal."""
        assert self.rate is not None
        start, n = self.history.now(), 0
        try:
            while not self._stop.is_set():
                n += 1
                # The schedule: proposal n leaves at start + n/rate (pacing, not a condition).
                self._stop.wait(max(0.0, start + n / self.rate - self.history.now()))
                action = self.rng.choices([a for a, _ in MIX], [w for _, w in MIX])[0]
                op = uuid.uuid4()
                try:
                    arguments, revision, facts = self._arguments(action, n, op)
                except httpx.HTTPError as exc:
                    self.history.append("phase", name="load_skipped", action=action,
                                        error=repr(exc)[:200])
                    continue
                _, record = self.p.proposal(action, arguments, operation_id=op,
                                            expected_revision=revision,
                                            envelope_ttl_s=harness.ENVELOPE_TTL_S)
                produce(producer, self.history, record, op=op, action=action, facts=facts,
                        stop=self._stop)
        except Exception as exc:  # reported in the soak's result, never swallowed
            self.errors.append(repr(exc))
            self.history.append("phase", name="load_failed", error=repr(exc))

    def _arguments(self, action: str, n: int, op: uuid.UUID
                   ) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
        if action == NOTE:
            return {"body": f"soak note {n}"}, None, {"body_len": len(f"soak note {n}")}
        if action == CONTACT:
            current = self._revision()
            older = [r for r in self._revisions if r != current]
            stale = bool(older) and self.rng.random() < STALE
            revision = self.rng.choice(older) if stale else current
            changes = {"phone": f"+1 555 {self.rng.randrange(10**6):06d}"}
            return {"changes": changes}, revision, {"expected_revision": revision,
                                                    "stale": stale, "fields": sorted(changes)}
        amount = self.rng.randrange(100, 50_000)  # ≤ 500.00: no finance-only rule needed
        arguments = {"invoice_id": invoice_of(op), "amount_minor": amount, "currency": "EUR",
                     "reason": "soak refund"}
        return arguments, None, {"amount_minor": amount, "invoice_id": invoice_of(op)}

    def _revision(self) -> str:
        """The record's current revision (its ETag), remembered for later stale proposals."""
        r = httpx.get(f"{self.p.crm.url}/v1/customers/{self.p.customer}", timeout=10,
                      headers={"Authorization": f"Bearer {self.p.tokens['read']}"})
        r.raise_for_status()
        revision = r.headers["ETag"].strip('"')
        if revision not in self._revisions:
            self._revisions.append(revision)
        return revision


def produce(producer: Producer, history: History, record: dict[str, Any], *, op: uuid.UUID,
            action: str, facts: dict[str, Any], stop: threading.Event | None = None) -> None:
    """Hand one proposal to the producer; its ``proposal`` history record is written when
    Kafka answers it. A full queue (a broker away) waits for room, never drops it."""
    sent = history.now()

    def delivered(err: KafkaError | None, _msg: object) -> None:
        history.append("proposal", operation_id=str(op), action=action, facts=facts,
                       sent_t=round(sent, 3), acked=err is None,
                       error=None if err is None else str(err))
    while True:
        try:
            producer.produce(**record, on_delivery=delivered)
            break
        except BufferError:
            producer.poll(0.5)  # serves answers, which frees room
            if stop is not None and stop.is_set():
                history.append("proposal", operation_id=str(op), action=action, facts=facts,
                               sent_t=round(sent, 3), acked=False, error="not sent: stopping")
                return
    producer.poll(0)


def capacity(p: Pipeline, history: History, n: int, timeout_s: float) -> float:
    """The box's burst capacity on this stack: ``n`` notes proposed at once, then the time
    until every one is terminal in the ledger; proposals per second. The burst is part of the
    soak's history (the checker holds them to every invariant, like the rest)."""
    producer = p.producer()
    ops = []
    first = history.now()
    history.append("phase", name="capacity_burst", n=n)
    for i in range(n):
        op = uuid.uuid4()
        body = f"capacity note {i}"
        _, record = p.proposal(NOTE, {"body": body}, operation_id=op,
                               envelope_ttl_s=harness.ENVELOPE_TTL_S)
        produce(producer, history, record, op=op, action=NOTE, facts={"body_len": len(body)})
        ops.append(str(op))
    producer.flush(60)

    def finished() -> int:
        with psycopg2.connect(p.database_url, connect_timeout=5) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM agent_command WHERE operation_id = ANY(%s::uuid[]) "
                        "AND state = ANY(%s)", (ops, sorted(commands.TERMINAL_STATES)))
            return int(cur.fetchone()[0])
    done = wait_until(lambda: finished() == n, timeout=timeout_s, interval=0.2)
    elapsed = history.now() - first
    if not done:
        raise AssertionError(f"the capacity burst of {n} notes did not finish in {timeout_s} s")
    rate = n / elapsed
    history.append("phase", name="capacity_measured", n=n, seconds=round(elapsed, 3),
                   per_s=round(rate, 2))
    return rate


class Approver(Worker):
    """Decides pending requests until stopped; every decision is in the history."""

    def __init__(self, p: Pipeline, history: History, seed: int) -> None:
        self.p, self.history, self.seed = p, history, seed
        self.errors: list[str] = []
        Worker.__init__(self, "soak-approver")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                asyncio.run(self._pass())
            except (OSError, asyncpg.PostgresError, errors.AgentLedgerError) as exc:
                # The primary restarting, or a standby stall past a transaction's bound: the
                # next pass tries again, as a person would.
                self.history.append("phase", name="approver_retry", error=repr(exc)[:200])
            self._stop.wait(APPROVER_PERIOD_S)

    def approves(self, op: uuid.UUID) -> bool:
        return random.Random(f"approve:{self.seed}:{op}").random() >= DENY

    async def _pass(self) -> None:
        tenant = uuid.UUID(self.p.tenant)
        conn = await asyncpg.connect(self.p.database_url, timeout=10)
        try:
            await conn.execute("SET ROLE agentledger_admission")
            for request in await approvals.listing(conn, tenant):
                if self._stop.is_set():
                    return
                await self._decide(conn, tenant, request)
        finally:
            await conn.close(timeout=5)

    async def _decide(self, conn: asyncpg.Connection, tenant: uuid.UUID,
                      request: approvals.Approval) -> None:
        approve = self.approves(request.operation_id)
        verdict = None
        if approve:
            verdict = await policy_repo.CedarAuthorizer().may_approve(
                conn, tenant_id=tenant, approver_id=APPROVER, requester_id=request.principal_id,
                action=allowlist.Allowlist.load().get(request.action),
                resource_id=request.resource_id)
        try:
            await approvals.decide(conn, tenant, request.approval_id, approver=APPROVER,
                                   approve=approve, shown_hash=request.hash_hex,
                                   reason="soak", approver_decision=verdict)
            result = "ok"
        except errors.AgentLedgerError as exc:
            result = exc.code
        self.history.append("decision", operation_id=str(request.operation_id),
                            action=request.action, approve=approve, result=result)
