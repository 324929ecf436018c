"""Admission service wiring: broker, database pool, allowlist, resolver, policy."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.opentelemetry import KafkaTelemetryMiddleware

from agentledger import admission, crypto, errors, identity
from agentledger.contracts import topics
from agentledger.kafka import topics as kafka_topics
from agentledger.ledger import keys, repository
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.resources.crm import CrmResolver
from agentledger.services.admission import handlers
from agentledger.services.admission.settings import AdmissionSettings


def create_app(settings: AdmissionSettings | None = None) -> FastStream:
    cfg = settings or AdmissionSettings.model_validate({})
    # FastStream's middleware continues each record's context and injects it into what we
    # publish; the confluent-kafka instrumentation is NOT also used (two traceparent headers).
    broker = KafkaBroker(cfg.kafka_bootstrap, acks="all", enable_idempotence=True,
                         client_id="agentledger-admission",
                         middlewares=(KafkaTelemetryMiddleware(),))
    app = FastStream(broker)
    rules = allowlist.Allowlist.load()
    resolver = CrmResolver(cfg.crm_url, cfg.crm_read_tokens)
    if cfg.require_identity and not cfg.envelope_keys:
        raise errors.IdentityRejected(
            "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS is empty: admission cannot verify identities")
    keys_ = identity.KeySet.from_pem(cfg.envelope_keys) if cfg.require_identity else None

    async def init(conn: asyncpg.Connection) -> None:
        repository.bound_silence(conn)  # a silent network fails a statement, never hangs it
        if cfg.db_role:
            await conn.execute(f'SET ROLE "{cfg.db_role}"')

    state: dict[str, asyncpg.Pool] = {}

    @app.on_startup
    async def start() -> None:
        kafka_topics.ensure(cfg.kafka_bootstrap, {
            cfg.proposals_topic: cfg.partitions, cfg.admissions_topic: cfg.partitions,
            topics.dlq_topic(cfg.proposals_topic): 1,
        }, replication=cfg.kafka_replication_factor)
        pool = await asyncpg.create_pool(cfg.database_url, min_size=1, max_size=cfg.pool_size,
                                         init=init)
        state["pool"] = pool
        handlers.register(broker, admission.Admitter(
            pool=pool, allowlist=rules, resolver=resolver,
            authorizer=policy_repo.CedarAuthorizer(),
            cipher=keys.PayloadCipher(crypto.MasterKey.from_b64(cfg.master_key.get_secret_value())),
            envelope_keys=keys_,
            budget_limits={"tool_calls": cfg.budget_tool_calls} if cfg.budget_tool_calls else {},
            decision_ttl=timedelta(seconds=cfg.decision_ttl_s),
            approval_ttl=timedelta(seconds=cfg.approval_ttl_s),
        ), group_id=cfg.group_id, proposals_topic=cfg.proposals_topic,
            admissions_topic=cfg.admissions_topic, group_instance_id=cfg.group_instance_id,
            session_timeout_ms=cfg.session_timeout_ms)

    @app.after_shutdown
    async def stop() -> None:
        await resolver.aclose()
        if "pool" in state:
            await state["pool"].close()

    return app
