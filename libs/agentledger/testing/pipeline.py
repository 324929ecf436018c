"""The whole pipeline as real processes: CRM, admission, relay, executors, reconciler
(and, on request, the approvals console).

Every service runs as ``python -m agentledger.services.<name>`` against the real broker and a
fresh database; topics live under a per-run namespace so runs never see each other.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from agentledger import db, identity, logins
from agentledger.kafka import logs
from agentledger.testing import identities, processes
from agentledger.testing import ledger as testing_ledger
from agentledger.testing.crm import Crm, run_crm
from agentledger.testing.polling import wait_until


def slot_active(database_url: str, slot: str) -> bool:
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
    finally:
        conn.close()
    return bool(row and row[0])


@dataclass(frozen=True)
class SessionIssuer:
    """A development identity provider: issues the session tokens ingress and the console accept."""

    private_pem: str
    public_pem: str
    kid: str = "idp-test"
    issuer: str = "agentledger-test-idp"
    audience: str = "agentledger-ingress"

    @classmethod
    def generate(cls) -> SessionIssuer:
        private_pem, public_pem = identity.generate_keypair("EdDSA")
        return cls(private_pem, public_pem)

    def issue(self, tenant: str, principal: str, roles: list[str], ttl_s: int = 3600) -> str:
        return identity.issue_session(self.private_pem, self.kid, tenant_id=uuid.UUID(tenant),
                                      subject=principal, audience=self.audience,
                                      issuer=self.issuer, ttl_s=ttl_s, roles=roles)


@dataclass
class Pipeline:
    bootstrap: str
    database_url: str
    crm: Crm
    ns: str
    tenant: str
    customer: str
    tokens: dict[str, str]
    services: dict[str, processes.Service] = field(default_factory=dict)
    ready: dict[str, Any] = field(default_factory=dict)  # readiness probe per service
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # With the console only: its URL, the identity provider of its sessions, and a second
    # tenant (tenant id → customer id) whose requests the first tenant must never see.
    console_url: str | None = None
    ingress_url: str | None = None
    sessions: SessionIssuer | None = None
    others: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str) -> str:
        return self.ns + name

    def producer(self) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                         "acks": "all", "logger": logs.LIBRDKAFKA})

    def propose(self, action: str, arguments: dict[str, Any], *,
                operation_id: uuid.UUID | None = None,
                expected_revision: str | None = None, tenant: str | None = None,
                evidence: list[dict[str, Any]] | None = None,
                envelope_ttl_s: int | None = None, target: str | None = None) -> uuid.UUID:
        """Publish a signed proposal (default: the first tenant's customer, by user:alice;
        ``target``: another connector's target, with the arguments as given)."""
        op, record = self.proposal(action, arguments, operation_id=operation_id,
                                   expected_revision=expected_revision, tenant=tenant,
                                   evidence=evidence, envelope_ttl_s=envelope_ttl_s,
                                   target=target)
        p = self.producer()
        p.produce(**record)
        assert p.flush(15) == 0
        return op

    def proposal(self, action: str, arguments: dict[str, Any], *,
                 operation_id: uuid.UUID | None = None,
                 expected_revision: str | None = None, tenant: str | None = None,
                 evidence: list[dict[str, Any]] | None = None,
                 envelope_ttl_s: int | None = None,
                 target: str | None = None) -> tuple[uuid.UUID, dict[str, Any]]:
        """A signed proposal as ``Producer.produce`` keyword arguments, for a caller that
        publishes on its own producer (as ``propose`` does on a fresh one)."""
        op = operation_id or uuid.uuid4()
        tenant = tenant or self.tenant
        customer = self.customer if tenant == self.tenant else self.others[tenant]
        body = {"schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
                "tenant_id": tenant, "principal_id": "user:alice", "operation_id": str(op),
                "action": action,
                "arguments": arguments if target else {"customer_id": customer, **arguments},
                "target": target or customer, "expected_revision": expected_revision,
                "planner": {"name": "e2e"}, "created_at": datetime.now(UTC).isoformat(),
                **({"evidence": evidence} if evidence is not None else {})}
        body = identities.sign(body, ttl_s=envelope_ttl_s)
        return op, {"topic": self.topic("agent.proposals.v1"), "key": tenant.encode(),
                    "value": json.dumps(body).encode(),
                    "headers": [("traceparent",
                                 f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01".encode())]}

    def state(self, op: uuid.UUID) -> tuple[str, str | None] | None:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT state, provider_receipt FROM agent_command"
                            " WHERE operation_id = %s", (str(op),))
                row = cur.fetchone()
        finally:
            conn.close()
        return (row[0], row[1]) if row else None

    def wait_state(self, op: uuid.UUID, *states: str, timeout: float = 60
                   ) -> tuple[str, str | None]:
        assert wait_until(lambda: (self.state(op) or ("",))[0] in states, timeout=timeout), (
            f"{op} stayed {self.state(op)}; wanted {states}\n"
            + "\n".join(f"--- {n}\n{s.tail(15)}" for n, s in self.services.items()))
        result = self.state(op)
        assert result is not None
        return result

    def pending_approval(self, op: uuid.UUID) -> bool:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM approval_request"
                            " WHERE operation_id = %s AND state = 'pending'",
                            (str(op),))
                return cur.fetchone() is not None
        finally:
            conn.close()

    def approve(self, op: uuid.UUID, approver: str = "user:fiona") -> None:
        """Approve the pending request of ``op`` through the real path (approver policy, hash)."""
        asyncio.run(_approve(self.database_url, uuid.UUID(self.tenant), op, approver))

    def sweep_once(self) -> dict[uuid.UUID, str]:
        """One whole reconciler pass, run here and now with the service's role and lookup
        credentials: the positive marker that recovery had its chance after a given moment."""
        return asyncio.run(_sweep_once(self.database_url, self.crm.url, {
            name: {self.tenant: self.tokens["lookup"]} for name in ("crm", "billing")}))

    def read(self, topic: str, predicate: Any, *, timeout: float = 60) -> list[dict[str, Any]]:
        """Records of ``topic`` (namespaced) whose JSON value satisfies ``predicate``."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"read-{uuid.uuid4().hex}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "logger": logs.LIBRDKAFKA})
        consumer.subscribe([self.topic(topic)])
        found: list[dict[str, Any]] = []

        def poll() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                value = json.loads(msg.value() or b"null")
                if predicate(value):
                    found.append(value)
            return bool(found)
        try:
            wait_until(poll, timeout=timeout, interval=0)
        finally:
            consumer.close()
        return found


async def _sweep_once(database_url: str, crm_url: str,
                      lookup_tokens: dict[str, dict[str, str]]) -> dict[uuid.UUID, str]:
    from agentledger.connectors import base, crm
    from agentledger.executor import reconciler

    connectors = crm.registry(crm_url)
    pool = await db.create_pool(database_url, role="agentledger_reconciler", size=2)
    try:
        worker = reconciler.Reconciler(pool=pool, connectors=connectors,
                                       credentials=base.Credentials("lookup", lookup_tokens),
                                       worker_id="test-sweep")
        return dict(await worker.sweep())
    finally:
        await pool.close()
        for connector in connectors.values():
            await connector.aclose()


async def _approve(database_url: str, tenant: uuid.UUID, op: uuid.UUID, approver: str) -> None:
    from agentledger.approvals import repository as approvals
    from agentledger.policy import allowlist
    from agentledger.policy import repository as policy_repo

    conn = await db.connect(database_url, role="agentledger_admission")
    try:
        pending = [a for a in await approvals.listing(conn, tenant) if a.operation_id == op]
        assert pending, "no pending approval for this operation"
        request = pending[0]
        verdict = await policy_repo.CedarAuthorizer().may_approve(
            conn, tenant_id=tenant, approver_id=approver, requester_id=request.principal_id,
            action=allowlist.Allowlist.load().get(request.action), resource_id=request.resource_id)
        await approvals.decide(conn, tenant, request.approval_id, approver=approver, approve=True,
                               shown_hash=request.hash_hex, reason="checked",
                               approver_decision=verdict)
    finally:
        await conn.close()


def _delete_topics(bootstrap: str, ns: str) -> None:
    # A client made at teardown, never one that lived through a broker restart: librdkafka
    # can hang for ever destroying such a handle (seen in CI: rd_kafka_destroy joining a
    # broker thread after the chaos tier's broker restart, the run stuck until its deadline).
    testing_ledger.delete_namespace_topics(
        AdminClient({"bootstrap.servers": bootstrap}, logger=logs.LIBRDKAFKA), ns)


def _front_door(prefix: str, port: int, sessions: SessionIssuer,
                more_keys: Mapping[str, str] | None = None) -> dict[str, str]:
    """The console's and ingress' shared settings: where they listen, whose sessions count."""
    return {f"{prefix}PORT": str(port),
            f"{prefix}SESSION_KEYS": json.dumps({sessions.kid: sessions.public_pem,
                                                 **(more_keys or {})}),
            f"{prefix}SESSION_ISSUER": sessions.issuer,
            f"{prefix}SESSION_AUDIENCE": sessions.audience}


@contextmanager
def pipeline(bootstrap: str, database_url: str, crm_database_url: str, logs: Path,
             *, executor_env: dict[str, str] | None = None,
             env: Mapping[str, Mapping[str, str]] | None = None,
             console: bool = False, ingress: bool = False, notifier: bool = False,
             prefix: Mapping[str, Sequence[str]] | None = None,
             crm_options: Mapping[str, Any] | None = None,
             connectors: Mapping[str, Mapping[str, Any]] | None = None,
             config_env: Mapping[str, str] | None = None,
             session_keys: Mapping[str, str] | None = None) -> Iterator[Pipeline]:
    """Start the pipeline; ``env`` adds variables per service name (``relay``, ``admission``,
    ``executor-crm``, ``executor-billing``, ``reconciler``, ``console``); ``prefix`` runs a
    service under a command (``ip netns exec NAME``: in a network namespace, tests/netns.py);
    ``crm_options`` passes keyword arguments to ``run_crm`` (where it runs and is reached).
    ``connectors`` adds connectors (plugins) beside the demo's, with their options: every
    service gets them in ``AGENTLEDGER_CONNECTORS``, and each gets an executor of its own
    (``executor-<name>``); ``config_env`` (an operator's ``AGENTLEDGER_ALLOWLIST``,
    ``AGENTLEDGER_POLICY_DIR``) goes to every service. ``session_keys`` ({kid: public PEM})
    are more signers of sessions ingress accepts (the MCP server's, for its OAuth callers).

    ``console`` also starts the approvals console and a second tenant with its own customer
    and principals, known to admission and the console (for tenant-isolation tests).
    ``notifier`` starts the notifier (approval notifications; its links point at the console
    when there is one)."""
    tag = uuid.uuid4().hex[:8]
    ns, slot = f"e2e{tag}.", f"e2e_{tag}"
    with ExitStack() as stack:
        crm = stack.enter_context(run_crm(crm_database_url, logs, **{
            "faults_enabled": "true", **(crm_options or {})}))
        tenant, customer = str(uuid.uuid4()), f"c-{tag}"
        asyncio.run(crm.customer(tenant, customer, email="ada@example.com"))
        tokens = {scope: asyncio.run(crm.token(tenant, scope))
                  for scope in ("read", "write", "lookup")}
        asyncio.run(identities.put_principals(database_url, tenant, identities.DEFAULT_PRINCIPALS))
        common = {"AGENTLEDGER_KAFKA_BOOTSTRAP": bootstrap,
                  "AGENTLEDGER_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
                  **(config_env or {})}
        if connectors:  # "{crm_url}" in an option: the CRM stand-in this pipeline started
            common["AGENTLEDGER_CONNECTORS"] = json.dumps(
                {"crm": {"url": crm.url}, "billing": {"url": crm.url}, **connectors}
            ).replace("{crm_url}", crm.url)
        # Each service logs in as its own role, as in production: never as the owner (issue 17).
        login_urls = asyncio.run(logins.ensure(database_url))
        p = Pipeline(bootstrap, database_url, crm, ns, tenant, customer, tokens)
        read_tokens = {tenant: tokens["read"]}
        if console:
            other, other_customer = str(uuid.uuid4()), f"c-{tag}-b"
            asyncio.run(crm.customer(other, other_customer, email="bea@example.com"))
            read_tokens[other] = asyncio.run(crm.token(other, "read"))
            asyncio.run(identities.put_principals(database_url, other,
                                                  identities.DEFAULT_PRINCIPALS))
            p.others[other] = other_customer
        stack.callback(_delete_topics, bootstrap, ns)
        # Where the ledger is at the end: a failover drill repoints the pipeline (p.database_url).
        stack.callback(lambda: testing_ledger.drop_slot(p.database_url, slot))

        def start(name: str, module: str, own: dict[str, str], ready: Any,
                  timeout: float = 90) -> None:
            login = login_urls.get(name.split("-")[0])
            as_login = {"AGENTLEDGER_DATABASE_URL": login} if login else {}
            p.services[name] = stack.enter_context(processes.running(
                module, {**common, **as_login, **own, **(env or {}).get(name, {})},
                logs / f"{name}.log",
                ready=ready, timeout=timeout, prefix=(prefix or {}).get(name, ())))
            p.ready[name] = ready

        start("relay", "agentledger.services.relay", {
            "AGENTLEDGER_RELAY_SLOT": slot, "AGENTLEDGER_RELAY_TOPIC_NAMESPACE": ns,
            "AGENTLEDGER_RELAY_EXEC_PARTITIONS": "3"}, lambda: slot_active(database_url, slot))
        start("admission", "agentledger.services.admission", {
            "AGENTLEDGER_ADMISSION_CRM_URL": crm.url,
            "AGENTLEDGER_ADMISSION_CRM_READ_TOKENS": json.dumps(read_tokens),
            "AGENTLEDGER_ADMISSION_GROUP_ID": f"admission-{tag}",
            "AGENTLEDGER_ADMISSION_PROPOSALS_TOPIC": p.topic("agent.proposals.v1"),
            "AGENTLEDGER_ADMISSION_ADMISSIONS_TOPIC": p.topic("agent.admissions.v1"),
            "AGENTLEDGER_ADMISSION_PARTITIONS": "3",
            "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS": json.dumps(identities.ENVELOPE_KEYS)},
            processes.group_has_members(bootstrap, f"admission-{tag}"))
        for connector in ("crm", "billing", *(connectors or {})):
            start(f"executor-{connector}", "agentledger.services.executor", {
                "AGENTLEDGER_EXECUTOR_CONNECTOR": connector,
                "AGENTLEDGER_EXECUTOR_EXEC_TOPIC": p.topic(f"exec.{connector}.v1"),
                "AGENTLEDGER_EXECUTOR_GROUP_ID": f"executor-{connector}-{tag}",
                "AGENTLEDGER_EXECUTOR_CRM_URL": crm.url,
                "AGENTLEDGER_EXECUTOR_PARTITIONS": "3",
                "AGENTLEDGER_EXECUTOR_WRITE_TOKENS": json.dumps(
                    {connector: {tenant: tokens["write"]}}),
                **(executor_env or {})},
                processes.group_has_members(bootstrap, f"executor-{connector}-{tag}"))
        start("reconciler", "agentledger.services.reconciler", {
            "AGENTLEDGER_RECONCILER_CRM_URL": crm.url, "AGENTLEDGER_RECONCILER_PERIOD_S": "1",
            "AGENTLEDGER_RECONCILER_LOOKUP_TOKENS": json.dumps(
                {c: {tenant: tokens["lookup"]}
                 for c in ("crm", "billing", *(connectors or {}))})},
            lambda: "event=reconciler_started"
            in (logs / "reconciler.log").read_text(errors="replace"))
        if console:
            p.sessions = SessionIssuer.generate()
            port = processes.free_port()
            p.console_url = f"http://127.0.0.1:{port}"
            start("console", "agentledger.services.console", {
                **_front_door("AGENTLEDGER_CONSOLE_", port, p.sessions),
                "AGENTLEDGER_CONSOLE_CRM_URL": crm.url,
                "AGENTLEDGER_CONSOLE_CRM_READ_TOKENS": json.dumps(read_tokens),
                "AGENTLEDGER_CONSOLE_COOKIE_SECURE": "false"},
                processes.http_ok(f"{p.console_url}/readyz"))
        if notifier:
            start("notifier", "agentledger.services.notifier", {
                "AGENTLEDGER_NOTIFIER_CONSOLE_URL": p.console_url or "http://127.0.0.1:8070",
                "AGENTLEDGER_NOTIFIER_PERIOD_S": "0.2",
                "AGENTLEDGER_NOTIFIER_WORKER_ID": f"notifier-{tag}"},
                lambda: "event=notifier_started"
                in (logs / "notifier.log").read_text(errors="replace"))
        if ingress:
            p.sessions = p.sessions or SessionIssuer.generate()
            port = processes.free_port()
            p.ingress_url = f"http://127.0.0.1:{port}"
            start("ingress", "agentledger.services.ingress", {
                **_front_door("AGENTLEDGER_INGRESS_", port, p.sessions, session_keys),
                # Signs with the key admission trusts (agentledger.testing.identities).
                "AGENTLEDGER_INGRESS_ENVELOPE_KEY": identities.PRIVATE_PEM,
                "AGENTLEDGER_INGRESS_ENVELOPE_KID": identities.KID,
                "AGENTLEDGER_INGRESS_REQUESTS_TOPIC": p.topic("agent.requests.v1"),
                "AGENTLEDGER_INGRESS_PROPOSALS_TOPIC": p.topic("agent.proposals.v1"),
                "AGENTLEDGER_INGRESS_GATEWAY_PROPOSALS_TOPIC": p.topic("gateway.proposals.v1"),
                "AGENTLEDGER_INGRESS_GROUP_ID": f"ingress-{tag}",
                "AGENTLEDGER_INGRESS_PARTITIONS": "3"},
                processes.http_ok(f"{p.ingress_url}/readyz"))
        yield p
