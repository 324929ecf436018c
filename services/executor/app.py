"""Executor service wiring: one connector, one consumer group, write credentials only here."""

from __future__ import annotations

import logging
import os
import socket

import asyncpg
from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.opentelemetry import KafkaTelemetryMiddleware

from agentledger import crypto
from agentledger.connectors import base, crm
from agentledger.contracts import topics
from agentledger.executor import dispatcher, inflight
from agentledger.kafka import topics as kafka_topics
from agentledger.ledger import dispatch, keys, repository
from agentledger.policy import allowlist
from agentledger.policy import repository as policy_repo
from agentledger.services.executor import handlers
from agentledger.services.executor.settings import ExecutorSettings

log = logging.getLogger(__name__)


def create_app(settings: ExecutorSettings | None = None) -> FastStream:
    cfg = settings or ExecutorSettings.model_validate({})
    topic = cfg.exec_topic or topics.exec_topic(cfg.connector)
    group = cfg.group_id or f"agentledger-executor-{cfg.connector}"
    # One propagator per client: FastStream's middleware (never also confluent's instrumentation).
    broker = KafkaBroker(cfg.kafka_bootstrap, acks="all", enable_idempotence=True,
                         client_id=f"agentledger-executor-{cfg.connector}",
                         middlewares=(KafkaTelemetryMiddleware(),))
    app = FastStream(broker)
    rules = allowlist.Allowlist.load()
    connectors = {name: c for name, c in crm.registry(cfg.crm_url).items()
                  if name == cfg.connector}
    running = inflight.InFlight(cfg.max_in_flight)
    state: dict[str, asyncpg.Pool] = {}
    stable = cfg.group_instance_id is not None  # Kafka admits one live member per id
    worker_id = cfg.worker_id or (
        f"executor-{cfg.connector}-{cfg.group_instance_id}" if cfg.group_instance_id
        else f"executor-{socket.gethostname()}-{os.getpid()}")

    async def init(conn: asyncpg.Connection) -> None:
        repository.bound_silence(conn)  # a silent network fails a statement, never hangs it
        if cfg.db_role:
            await conn.execute(f'SET ROLE "{cfg.db_role}"')

    @app.on_startup
    async def start() -> None:
        kafka_topics.ensure(cfg.kafka_bootstrap,
                            {topic: cfg.partitions, topics.dlq_topic(topic): 1},
                            replication=cfg.kafka_replication_factor)
        pool = await asyncpg.create_pool(cfg.database_url, min_size=1, max_size=cfg.pool_size,
                                         init=init)
        state["pool"] = pool
        if stable:
            # Our predecessor under this identity is gone (Kafka admits one live static
            # member per id): its claims need not wait out their leases (issue 18 §4).
            async with pool.acquire() as conn:
                ended = await dispatch.end_leases_of(conn, worker_id)
            log.info("event=predecessor_claims_released worker_id=%s count=%d", worker_id, ended)
        handlers.register(broker, dispatcher.Dispatcher(
            pool=pool, connectors=connectors,
            credentials=base.Credentials("write", cfg.write_tokens),
            cipher=keys.PayloadCipher(crypto.MasterKey.from_b64(cfg.master_key.get_secret_value())),
            authorizer=policy_repo.CedarAuthorizer(), allowlist=rules,
            worker_id=worker_id,
            lease_s=cfg.lease_s, max_generations=cfg.max_generations,
            call_timeout_s=cfg.call_timeout_s,
        ), running, topic=topic, group_id=group, group_instance_id=cfg.group_instance_id,
            session_timeout_ms=cfg.session_timeout_ms)

    @app.after_shutdown
    async def stop() -> None:
        # Finish in-flight calls (their claims) before closing the pool.
        await running.drain(cfg.drain_s)
        for connector in connectors.values():
            await connector.aclose()
        if "pool" in state:
            await state["pool"].close()

    return app
