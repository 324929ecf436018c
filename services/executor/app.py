"""Executor service wiring: one connector, one consumer group, write credentials only here."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

import confluent_kafka

from agentledger import crypto, services
from agentledger.connectors import base, plugins
from agentledger.contracts import topics
from agentledger.executor import dispatcher, inflight
from agentledger.kafka import batch
from agentledger.ledger import dispatch, groupcommit, keys
from agentledger.policy import allowlist
from agentledger.policy import memo as policy_memo
from agentledger.policy import repository as policy_repo
from agentledger.services.executor import handlers
from agentledger.services.executor.settings import ExecutorSettings

log = logging.getLogger(__name__)


@dataclass
class ExecutorService:
    """One executor instance: a consumer group member claiming exec records in batches."""

    cfg: ExecutorSettings

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop``); then drain in-flight calls and leave."""
        cfg = self.cfg
        topic = cfg.exec_topic or topics.exec_topic(cfg.connector)
        group = cfg.group_id or f"agentledger-executor-{cfg.connector}"
        client_id = f"agentledger-executor-{cfg.connector}"
        rules = allowlist.Allowlist.load()
        connectors = plugins.load(plugins.configured(cfg.connectors, cfg.crm_url),
                                  [cfg.connector])
        running = inflight.InFlight(cfg.max_in_flight)
        stable = cfg.group_instance_id is not None  # Kafka admits one live member per id
        worker_id = cfg.worker_id or (
            f"executor-{cfg.connector}-{cfg.group_instance_id}" if cfg.group_instance_id
            else f"executor-{socket.gethostname()}-{os.getpid()}")

        async with services.started(
            database_url=cfg.database_url, role=cfg.db_role, pool_size=cfg.pool_size,
            bootstrap=cfg.kafka_bootstrap, topics={topic: cfg.partitions,
                                                   topics.dlq_topic(topic): 1},
            replication=cfg.kafka_replication_factor, stop=stop,
        ) as up:
            pool, stop = up.pool, up.stop
            producer = confluent_kafka.Producer(
                batch.producer_config(cfg.kafka_bootstrap, client_id=client_id))
            commits = groupcommit.GroupCommit(pool)
            try:
                if stable:
                    # Our predecessor under this identity is gone (Kafka admits one live static
                    # member per id): its claims need not wait out their leases (issue 18 §4).
                    async with pool.acquire() as conn:
                        ended = await dispatch.end_leases_of(conn, worker_id)
                    log.info("event=predecessor_claims_released worker_id=%s count=%d",
                             worker_id, ended)
                work = dispatcher.Dispatcher(
                    pool=pool, connectors=connectors,
                    credentials=base.Credentials("write", cfg.write_tokens),
                    cipher=keys.PayloadCipher(
                        crypto.MasterKey.from_b64(cfg.master_key.get_secret_value())),
                    authorizer=policy_repo.CedarAuthorizer(), allowlist=rules,
                    worker_id=worker_id,
                    lease_s=cfg.lease_s, max_generations=cfg.max_generations,
                    call_timeout_s=cfg.call_timeout_s, group=commits,
                )
                connect = batch.connector(batch.consumer_config(
                    cfg.kafka_bootstrap, group_id=group, group_instance_id=cfg.group_instance_id,
                    session_timeout_ms=cfg.session_timeout_ms, client_id=client_id), [topic])
                log.info("event=executor_started topic=%s group=%s worker_id=%s", topic, group,
                         worker_id)
                await batch.BatchConsumer(
                    connect, producer, handlers.handler(work, running),
                    max_records=cfg.batch_size, concurrency=cfg.max_in_flight,
                ).run(stop)
            finally:
                # Finish in-flight calls (their claims) before closing the pool.
                await running.drain(cfg.drain_s)
                commits.log_stats()
                policy_memo.log_stats()
                await asyncio.to_thread(producer.flush, 10)
                for connector in connectors.values():
                    await connector.aclose()


def create_app(settings: ExecutorSettings | None = None) -> ExecutorService:
    return ExecutorService(settings or ExecutorSettings.model_validate({}))
