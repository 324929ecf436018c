"""The soak's observers and its final snapshot.

``LedgerPoller`` polls the ledger (state changes of commands) and the relay's slot against
the outbox rows still owed (see ``checker.slot_never_past_owed``); ``TopicWatcher`` reads
admission answers and audit events off their topics as they appear. Both append to the
history and skip a round the stack cannot answer (the primary restarting, a broker away).
``snapshot`` reads the settled end: ledger, topics (to their end offsets), provider effects,
``explain`` for every command.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

import asyncpg
import psycopg2
from confluent_kafka import Consumer, Message

from agentledger.audit import explain as audit_explain
from agentledger.connectors import crm as crm_connectors
from agentledger.testing import kafka_read
from agentledger.testing.pipeline import Pipeline
from tests.chaos import harness
from tests.soak import checker, load
from tests.soak.history import History
from tests.soak.worker import Worker

# Poll period of the ledger and the slot: short, so that the slot check's blind window (a
# confirm between a commit and the next observation) stays small; cheap (indexed reads).
POLL_S = 1.0

OWED_SQL = ("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, "
            "(SELECT coalesce(json_agg(json_build_array('command', id, xmin::text)), '[]') "
            " FROM command_outbox), "
            "(SELECT coalesce(json_agg(json_build_array('event', id, xmin::text)), '[]') "
            " FROM event_outbox)")


def _connect(url: str) -> Any:
    conn = psycopg2.connect(url, connect_timeout=5)
    conn.autocommit = True  # reads only: never a commit that would wait for the standby
    return conn


class LedgerPoller(Worker):
    def __init__(self, p: Pipeline, history: History) -> None:
        self.p, self.history = p, history
        self.slot = p.services["relay"].env["AGENTLEDGER_RELAY_SLOT"]
        self.seen: dict[str, str] = {}  # operation id → last state seen
        self.rounds = 0
        self._since: datetime | None = None
        Worker.__init__(self, "soak-ledger")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = _connect(self.p.database_url)
                try:
                    self._states(conn)
                    self._slot(conn)
                    self.rounds += 1
                finally:
                    conn.close()
            except psycopg2.Error as exc:
                # The primary is away: the next round sees what changed meanwhile.
                self.history.append("phase", name="poll_skipped", error=str(exc)[:200])
            self._stop.wait(POLL_S)

    def _states(self, conn: Any) -> None:
        with conn.cursor() as cur:
            # Overlapping rounds (updated_at is the writer's clock, set before its commit).
            cur.execute("SELECT operation_id::text, state, outcome_reason, updated_at, action "
                        "FROM agent_command WHERE updated_at > coalesce(%s::timestamptz, "
                        "'-infinity'::timestamptz) - interval '60 seconds' ORDER BY updated_at",
                        (self._since,))
            for op, state, reason, updated, action in cur.fetchall():
                self._since = max(self._since or updated, updated)
                if self.seen.get(op) != state:
                    self.seen[op] = state
                    self.history.append("state", operation_id=op, state=state, action=action,
                                        reason=reason)

    def _slot(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute(OWED_SQL)
            lsn, commands, events = cur.fetchone()
            cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s", (self.slot,))
            row = cur.fetchone()
            cur.execute(OWED_SQL)
            _, commands_after, events_after = cur.fetchone()
        self.history.append("slot", lsn=int(lsn), confirmed=int(row[0]) if row and row[0] else None,
                            before=commands + events, after=commands_after + events_after)


class TopicWatcher(Worker):
    """Admission answers and audit events, recorded as they are read."""

    def __init__(self, p: Pipeline, history: History) -> None:
        self.p, self.history = p, history
        self.read = 0
        self.refused: set[str] = set()  # operation ids admission refused (an answer seen)
        Worker.__init__(self, "soak-topics")

    def _run(self) -> None:
        admissions, audit = self.p.topic("agent.admissions.v1"), self.p.topic("audit.events.v1")
        consumer = Consumer({"bootstrap.servers": self.p.bootstrap,
                             "group.id": f"soak-watch-{uuid.uuid4().hex}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "log_level": 0, "topic.metadata.refresh.interval.ms": 5000})
        consumer.subscribe([admissions, audit])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(200, timeout=0.5):
                    if msg.error() is not None:
                        continue  # a broker away, a topic not created yet: read on
                    self.read += 1
                    value = json.loads(msg.value() or b"{}")
                    if msg.topic() == admissions:
                        if value.get("status") in ("rejected", "conflict"):
                            self.refused.add(str(value.get("operation_id")))
                        self.history.append("admission", operation_id=value.get("operation_id"),
                                            status=value.get("status"),
                                            reason_code=value.get("reason_code"))
                    else:
                        headers = _headers(msg)
                        self.history.append("audit", operation_id=value.get("operation_id"),
                                            type=headers.get("type"), id=headers.get("id"))
        finally:
            consumer.close()  # at the end, every broker up: nothing left outstanding


def _headers(msg: Message) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or []) if isinstance(v, bytes)}


def contracts(p: Pipeline) -> dict[str, checker.Contract]:
    return {name: checker.Contract(c.contract.idempotency, c.contract.lookup,
                                   c.contract.fencing)
            for name, c in crm_connectors.registry(p.crm.url).items()}


def commands(p: Pipeline) -> dict[str, checker.Command]:
    """Every command of the ledger, with its count of attempts."""
    conn = _connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT c.operation_id::text, c.action, c.connector, c.state, "
                        "c.provider_receipt, c.outcome_reason, (SELECT count(*) FROM "
                        "command_attempt a WHERE a.tenant_id = c.tenant_id AND a.operation_id "
                        "= c.operation_id), c.contradicted_at IS NOT NULL FROM agent_command c")
            return {r[0]: checker.Command(r[0], r[1], r[2], r[3], r[4], r[5], int(r[6]),
                                          bool(r[7]))
                    for r in cur.fetchall()}
    finally:
        conn.close()


def approvals(p: Pipeline) -> dict[str, str]:
    """Operation id → the state of its latest approval request."""
    conn = _connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT DISTINCT ON (operation_id) operation_id::text, state "
                        "FROM approval_request ORDER BY operation_id, created_at DESC")
            return dict(cur.fetchall())
    finally:
        conn.close()


def snapshot(p: Pipeline, acked: set[str]) -> checker.Snapshot:
    """The settled end of the soak. ``acked``: the operation ids the load proposed."""
    conn = _connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT operation_id::text, event_id::text, type FROM audit_event "
                        "WHERE operation_id IS NOT NULL")
            ledger_audit: dict[str, dict[str, str]] = defaultdict(dict)
            for op, event, kind in cur.fetchall():
                ledger_audit[op][event] = kind
    finally:
        conn.close()
    effects, stray = _effects(p, acked)
    exec_topics = [p.topic(f"exec.{c}.v1") for c in ("crm", "billing")]
    published = {(m.key() or b"").decode().rsplit(":", 1)[-1]
                 for m in kafka_read.read_to_end(p.bootstrap, exec_topics)}
    topic_audit: dict[str, set[str]] = defaultdict(set)
    for m in kafka_read.read_to_end(p.bootstrap, [p.topic("audit.events.v1")]):
        headers = _headers(m)
        if "id" in headers:  # keyed by the operation the record names ("" when none)
            topic_audit[json.loads(m.value() or b"{}").get("operation_id") or ""].add(
                headers["id"])
    found = commands(p)
    return checker.Snapshot(
        commands=found, contracts=contracts(p), effects=effects, stray_effects=tuple(stray),
        approvals=approvals(p), published=frozenset(published), ledger_audit=dict(ledger_audit),
        topic_audit={op: frozenset(ids) for op, ids in topic_audit.items()},
        explained=asyncio.run(_explain_all(p, list(found))),
        missing_dead_letters=harness.missing_dead_letters(p))


def _effects(p: Pipeline, acked: set[str]) -> tuple[dict[str, int], list[str]]:
    """Provider effects per operation: the CRM's keyed effects by idempotency key, refunds by
    the invoice the load derived from the operation id (billing keeps no key)."""
    per_op: Counter[str] = Counter()
    stray: list[str] = []
    for e in asyncio.run(p.crm.effects(p.tenant)):
        if e["kind"] == "refund.created":
            continue  # counted from the refunds themselves, below
        if e["idempotency_key"] in acked:
            per_op[e["idempotency_key"]] += 1
        else:
            stray.append(f"{e['kind']} key={e['idempotency_key']} effect={e['effect_id']}")
    invoices = {load.invoice_of(op): op for op in acked}
    conn = _connect(p.crm.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT invoice_id FROM crm_refund WHERE tenant_id = %s", (p.tenant,))
            for (invoice,) in cur.fetchall():
                if invoice in invoices:
                    per_op[invoices[invoice]] += 1
                else:
                    stray.append(f"refund invoice={invoice}")
    finally:
        conn.close()
    return dict(per_op), stray


async def _explain_all(p: Pipeline, ops: list[str]) -> dict[str, checker.Explained]:
    """``explain`` (the library function the CLI calls) for every command, as the auditor."""
    tenant = uuid.UUID(p.tenant)
    conn = await asyncpg.connect(p.database_url)
    try:
        await conn.execute("SET ROLE agentledger_auditor")
        out: dict[str, checker.Explained] = {}
        for op in ops:
            found = await audit_explain.explain(conn, tenant, uuid.UUID(op))
            out[op] = checker.Explained(found.known.state, found.known.receipt,
                                        frozenset(e.event_id for e in found.timeline))
        return out
    finally:
        await conn.close()
