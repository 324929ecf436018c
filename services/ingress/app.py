"""Ingress wiring: FastAPI app, the Kafka broker (idempotent producer, acks=all), errors, limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from confluent_kafka.admin import AdminClient
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from faststream.confluent import KafkaBroker
from starlette.exceptions import HTTPException

from agentledger import errors, identity, services, web
from agentledger.contracts import topics
from agentledger.kafka import logs
from agentledger.services.ingress import handlers, intake
from agentledger.services.ingress.settings import IngressSettings

log = logging.getLogger(__name__)

# A readiness probe must answer well inside the orchestrator's probe timeout.
READY_TIMEOUT_S = 2.0


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def _agentledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.AgentLedgerError)
    log.info("event=request_rejected code=%s path=%s reason=%s", exc.code, request.url.path,
             exc.message[:200])
    status = web.status_of(exc)
    if isinstance(exc, errors.IdentityRejected):
        # The precise reason is logged, not returned: it would help forge the next token.
        response = _error(status, exc.code, "the session token is missing or invalid")
        response.headers["www-authenticate"] = "Bearer"
        return response
    return _error(status, exc.code, exc.message)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Location and reason only: the offending input is never echoed back or logged.
    problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: "
                         f"{e.get('msg', 'invalid')}" for e in exc.errors())
    return _error(422, "invalid_request", problems[:1000])


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
        exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


def create_app(settings: IngressSettings | None = None) -> FastAPI:
    """The ingress ASGI app; the broker starts in its lifespan."""
    cfg = settings or IngressSettings.model_validate({})
    broker = KafkaBroker(cfg.kafka_bootstrap, acks="all", enable_idempotence=True,
                         client_id="agentledger-ingress")
    gate = intake.Intake(
        broker=broker, session_keys=identity.KeySet.from_pem(cfg.session_keys),
        session_issuer=cfg.session_issuer, session_audience=cfg.session_audience,
        signer=identity.EnvelopeSigner(cfg.envelope_key.get_secret_value(), cfg.envelope_kid,
                                       ttl_s=cfg.envelope_ttl_s),
        requests_topic=cfg.requests_topic, proposals_topic=cfg.proposals_topic,
        publish_timeout_s=cfg.publish_timeout_s,
        conflicts=(intake.ConflictCheck(cfg.database_url, cfg.conflict_check_timeout_s)
                   if cfg.database_url else None),
    )
    outputs = (cfg.requests_topic, cfg.proposals_topic)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.ensure_topics(cfg.kafka_bootstrap, {
            cfg.requests_topic: cfg.partitions, cfg.proposals_topic: cfg.partitions,
            cfg.gateway_proposals_topic: cfg.partitions,
            topics.dlq_topic(cfg.gateway_proposals_topic): 1,
        }, replication=cfg.kafka_replication_factor)
        handlers.register_gateway_entry(broker, gate, topic=cfg.gateway_proposals_topic,
                                        group_id=cfg.group_id,
                                        max_body_bytes=cfg.max_body_bytes)
        await broker.start()
        if gate.conflicts is not None:
            await gate.conflicts.start()
        log.info("event=ingress_ready conflict_check=%s", gate.conflicts is not None)
        try:
            yield
        finally:
            await broker.stop()
            if gate.conflicts is not None:
                await gate.conflicts.close()

    app = FastAPI(title="agentledger ingress", version="1", lifespan=lifespan)
    app.state.intake = gate
    app.add_middleware(web.BodyLimit, limit=cfg.max_body_bytes)
    app.add_exception_handler(errors.AgentLedgerError, _agentledger_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    admin = AdminClient({"bootstrap.servers": cfg.kafka_bootstrap}, logger=logs.LIBRDKAFKA)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        try:
            metadata = await asyncio.to_thread(admin.list_topics, timeout=READY_TIMEOUT_S)
        except Exception:
            return _error(503, "kafka_unavailable", "Kafka metadata did not answer")
        missing = [t for t in outputs if t not in metadata.topics]
        if missing:
            return _error(503, "topics_missing", f"missing topics: {', '.join(missing)}")
        return JSONResponse({"status": "ready"})

    app.include_router(handlers.api)
    return app
