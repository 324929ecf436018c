"""Admission service wiring: batch consumer, database pool, allowlist, resolver, policy."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

import confluent_kafka

from agentledger import admission, crypto, errors, identity, services
from agentledger import settings as shared
from agentledger.approvals import quorum
from agentledger.budgets import rules as budget_rules_mod
from agentledger.connectors import plugins
from agentledger.contracts import topics
from agentledger.kafka import batch
from agentledger.ledger import groupcommit, keys
from agentledger.policy import allowlist
from agentledger.policy import check as policy_check
from agentledger.policy import memo as policy_memo
from agentledger.policy import repository as policy_repo
from agentledger.services.admission import handlers
from agentledger.services.admission.settings import AdmissionSettings

log = logging.getLogger(__name__)


@dataclass
class AdmissionService:
    """One admission instance: a consumer group member admitting proposals in batches."""

    cfg: AdmissionSettings

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop``), then finish the batch in hand and leave."""
        cfg = self.cfg
        rules = allowlist.Allowlist.load()
        # Bad budgets stop the service here, naming what (as `agentledger check-config`).
        sources = shared.PolicySources()
        budget_rules = policy_check.load_budgets(sources.budgets, rules)
        approval_rules = policy_check.load_approvals(sources.approvals, rules)
        if cfg.require_identity and not cfg.envelope_keys:
            raise errors.IdentityRejected(
                "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS is empty: admission cannot verify identities")
        keys_ = identity.KeySet.from_pem(cfg.envelope_keys) if cfg.require_identity else None
        configured = plugins.configured(cfg.connectors, cfg.crm_url)
        async with services.started(
            database_url=cfg.database_url, role=cfg.db_role, pool_size=cfg.pool_size,
            bootstrap=cfg.kafka_bootstrap, topics={
                cfg.proposals_topic: cfg.partitions, cfg.admissions_topic: cfg.partitions,
                topics.dlq_topic(cfg.proposals_topic): 1,
            }, replication=cfg.kafka_replication_factor, stop=stop,
        ) as running:
            resolver = plugins.resolver(configured, plugins.read_tokens(
                configured, cfg.read_tokens, cfg.crm_read_tokens))
            await self._serve(running, rules, keys_, resolver, budget_rules, approval_rules)

    async def _serve(self, running: services.Running, rules: allowlist.Allowlist,
                     keys_: identity.KeySet | None, resolver: plugins.RoutingResolver,
                     budget_rules: budget_rules_mod.Budgets,
                     approval_rules: quorum.ApprovalRules) -> None:
        cfg, pool = self.cfg, running.pool
        producer = confluent_kafka.Producer(
            batch.producer_config(cfg.kafka_bootstrap, client_id="agentledger-admission"))
        commits = groupcommit.GroupCommit(pool)
        admitter: admission.Admitter | None = None
        try:
            connect = batch.connector(batch.consumer_config(
                cfg.kafka_bootstrap, group_id=cfg.group_id,
                group_instance_id=cfg.group_instance_id,
                session_timeout_ms=cfg.session_timeout_ms, client_id="agentledger-admission"),
                [cfg.proposals_topic])
            admitter = admission.Admitter(
                pool=pool, allowlist=rules, resolver=resolver,
                authorizer=policy_repo.CedarAuthorizer(),
                cipher=keys.PayloadCipher(
                    crypto.MasterKey.from_b64(cfg.master_key.get_secret_value())),
                envelope_keys=keys_,
                budget_limits={"tool_calls": cfg.budget_tool_calls} if cfg.budget_tool_calls
                else {}, budget_rules=budget_rules, approval_rules=approval_rules,
                decision_ttl=timedelta(seconds=cfg.decision_ttl_s),
                approval_ttl=timedelta(seconds=cfg.approval_ttl_s), group=commits,
            )
            log.info("event=admission_started topic=%s group=%s", cfg.proposals_topic,
                     cfg.group_id)
            await batch.BatchConsumer(
                connect, producer, handlers.handler(admitter, cfg.admissions_topic),
                max_records=cfg.batch_size, concurrency=cfg.concurrency,
            ).run(running.stop)
        finally:
            commits.log_stats()
            policy_memo.log_stats()
            if admitter is not None:
                admitter.batches.log_stats()
            await asyncio.to_thread(producer.flush, 10)
            await resolver.aclose()


def create_app(settings: AdmissionSettings | None = None) -> AdmissionService:
    return AdmissionService(settings or AdmissionSettings.model_validate({}))
