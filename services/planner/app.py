"""Planner service wiring: broker, retriever (READ-only CRM token), adapter, allowlist."""

from __future__ import annotations

import dataclasses

import asyncpg
from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.opentelemetry import KafkaTelemetryMiddleware

from agentledger import db, errors, identity, services
from agentledger.connectors import plugins
from agentledger.contracts import topics
from agentledger.evals import shadow
from agentledger.planning import adapters, budget, proposer
from agentledger.policy import allowlist
from agentledger.services.planner import handlers
from agentledger.services.planner.settings import PlannerSettings


def build_adapter(cfg: PlannerSettings, rules: allowlist.Allowlist) -> adapters.Adapter:
    """The configured adapter (``rules`` unless told otherwise)."""
    if cfg.adapter == "openai":
        key = cfg.openai_api_key.get_secret_value() if cfg.openai_api_key else None
        return adapters.OpenAIAdapter(base_url=cfg.openai_base_url, model=cfg.openai_model,
                                      api_key=key, rules=rules, timeout_s=cfg.model_timeout_s)
    if cfg.adapter == "scripted":
        if cfg.script_path is None:
            raise errors.ValidationFailed("the scripted adapter needs a script_path")
        return adapters.ScriptedAdapter.from_jsonl(cfg.script_path, rules)
    return adapters.RulesAdapter()


def create_app(settings: PlannerSettings | None = None) -> FastStream:
    cfg = settings or PlannerSettings.model_validate({})
    # One propagator per client: FastStream's middleware (never also confluent's instrumentation).
    broker = KafkaBroker(cfg.kafka_bootstrap, acks="all", enable_idempotence=True,
                         client_id="agentledger-planner",
                         middlewares=(KafkaTelemetryMiddleware(),))
    app = FastStream(broker)
    rules = allowlist.Allowlist.load(cfg.allowlist_path)
    configured = plugins.configured(cfg.connectors, cfg.crm_url)
    retriever = plugins.retriever(cfg.retriever, configured, plugins.read_tokens(
        configured, cfg.read_tokens, cfg.crm_read_tokens).get(cfg.retriever, {}))
    adapter = build_adapter(cfg, rules)
    planner = proposer.Proposer(retriever=retriever, adapter=adapter, rules=rules,
                                envelope_keys=identity.KeySet.from_pem(cfg.envelope_keys))
    pools: list[asyncpg.Pool] = []
    shadows: list[shadow.ShadowPlanner] = []

    @app.on_startup
    async def start() -> None:
        await services.ensure_topics(cfg.kafka_bootstrap, {
            cfg.requests_topic: cfg.partitions, cfg.proposals_topic: cfg.partitions,
            topics.dlq_topic(cfg.requests_topic): 1, cfg.admissions_topic: cfg.partitions,
        }, replication=cfg.kafka_replication_factor)
        if cfg.database_url:
            pool = await db.create_pool(cfg.database_url, role=cfg.db_role, size=4)
            pools.append(pool)
            budgeted = dataclasses.replace(
                planner, tokens=budget.TokenBudget(pool, per_call=cfg.tokens_per_call))
        else:
            budgeted = planner
        serving: handlers.Planner = budgeted
        shadow_cfg = shadow.ShadowSettings()
        if shadow_cfg.adapter is not None:
            # A candidate beside production (R9.2): same request and evidence, its proposal
            # marked shadow and only recorded on agent.shadow.v1, never admitted.
            await services.ensure_topics(cfg.kafka_bootstrap, {shadow_cfg.topic: cfg.partitions},
                                         replication=cfg.kafka_replication_factor)
            shadowing = shadow.ShadowPlanner(
                primary=budgeted, candidate=shadow.build_candidate(shadow_cfg, rules),
                record=shadow.kafka_recorder(broker.publish, shadow_cfg.topic),
                max_in_flight=shadow_cfg.max_in_flight, timeout_s=shadow_cfg.timeout_s)
            shadows.append(shadowing)
            serving = shadowing
        handlers.register(broker, serving, group_id=cfg.group_id,
                          requests_topic=cfg.requests_topic, proposals_topic=cfg.proposals_topic,
                          admissions_topic=cfg.admissions_topic)

    @app.after_shutdown
    async def stop() -> None:
        for shadowing in shadows:
            await shadowing.drain()
        await retriever.aclose()
        for pool in pools:
            await pool.close()
        if isinstance(adapter, adapters.OpenAIAdapter):
            await adapter.aclose()

    return app
