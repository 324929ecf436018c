"""Routes and the Kafka entry of ingress: thin; the work is in ``intake``.

- ``POST /v1/requests``  → ``agent.requests.v1`` (202 with operation and request ids)
- ``POST /v1/proposals`` → ``agent.proposals.v1`` (202 with operation and proposal ids, and
  the run id when ``AgentLedger-Run`` names the run the proposal is a step of)
- ``gateway.proposals.v1`` (``authorization`` header, optional ``idempotency-key`` and
  ``agentledger-run``) → ``agent.proposals.v1``; invalid tokens, bodies and headers go to
  ``gateway.proposals.dlq.v1``.

No ``from __future__ import annotations``: FastAPI and FastStream read these signatures.
"""

from typing import Annotated, Any

import confluent_kafka
from fastapi import APIRouter, Depends, Header, Request
from faststream import AckPolicy
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import errors, identity
from agentledger.kafka import handling
from agentledger.services.ingress import intake, models

KEY_PATTERN = identity.IDEMPOTENCY_KEY_PATTERN

AuthorizationHeader = Annotated[str | None, Header(max_length=8192)]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", pattern=KEY_PATTERN)]
# The run a proposal is a step of: its steps share the run's budgets (intake.Intake.run_id).
RunHeader = Annotated[str | None, Header(
    alias="AgentLedger-Run", pattern=identity.RUN_NAME_PATTERN,
    description="The run this proposal is a step of (1-128 of A-Z a-z 0-9 . _ : ~ -): every "
                "step of a run spends the same budget. Without it, the call is its own run.")]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid session token"},
    409: {"description": "The Idempotency-Key already holds a command with other content"},
    413: {"description": "Body larger than the limit"},
    503: {"description": "Kafka did not acknowledge; retry with the same key"},
}

api = APIRouter()


def _intake(request: Request) -> intake.Intake:
    found: intake.Intake = request.app.state.intake
    return found


async def _session(request: Request, authorization: AuthorizationHeader = None
                   ) -> identity.Session:
    # A dependency, so the token is checked before the body is even validated.
    return _intake(request).authenticate(authorization)


Session = Annotated[identity.Session, Depends(_session)]


def _trace(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}


@api.post("/v1/requests", status_code=202, responses=ERRORS)
async def submit_request(
    session: Session, body: models.RequestBody, request: Request,
    idempotency_key: IdempotencyKey = None, run: RunHeader = None,
) -> models.Accepted:
    """Accept a goal for the planner; the same Idempotency-Key always gives the same operation.
    A request is its own run: ``AgentLedger-Run`` is refused here (400, nothing published)."""
    return await _intake(request).submit_request(session, body, idempotency_key,
                                                   _trace(request), run=run)


@api.post("/v1/proposals", status_code=202, responses=ERRORS)
async def submit_proposal(
    session: Session, body: models.ProposalBody, request: Request,
    idempotency_key: IdempotencyKey = None, run: RunHeader = None,
) -> models.Accepted:
    """Accept a gateway's own proposal for admission; 409 when its Idempotency-Key already
    holds a command with other content (knowable now: nothing is published). With
    ``AgentLedger-Run`` it is a step of that run and spends the run's budget."""
    await _intake(request).refuse_known_conflict(session, body, idempotency_key)
    return await _intake(request).submit_proposal(session, body, idempotency_key,
                                                   _trace(request), run=run)


def register_gateway_entry(broker: KafkaBroker, gate: intake.Intake, *, topic: str,
                           group_id: str, max_body_bytes: int) -> None:
    """Subscribe to ``gateway.proposals.v1``: the Kafka twin of ``POST /v1/proposals``."""
    async def on_gateway_proposal(msg: KafkaMessage) -> None:
        headers = handling.headers_of(msg)
        session = gate.authenticate(headers.get("authorization"))  # invalid → DLQ
        if len(msg.body) > max_body_bytes:
            raise errors.PoisonMessage(f"body larger than {max_body_bytes} bytes")
        body = models.ProposalBody.model_validate_json(msg.body)
        raw_key = headers.get("idempotency-key")
        key = raw_key.decode("latin-1") if raw_key is not None else None
        if key is not None and not identity.is_idempotency_key(key):
            raise errors.PoisonMessage("idempotency-key header is malformed")
        raw_run = headers.get("agentledger-run")
        run = raw_run.decode("latin-1") if raw_run is not None else None
        if run is not None and not identity.is_run_name(run):
            raise errors.PoisonMessage("agentledger-run header is malformed")
        raw = msg.raw_message
        if not isinstance(raw, confluent_kafka.Message):
            raise TypeError("batch messages are not supported")
        record = (raw.topic() or "", raw.partition() or 0, raw.offset() or 0)
        await gate.submit_proposal(session, body, key, headers, record=record, run=run)

    broker.subscriber(
        topic, group_id=group_id, auto_offset_reset="earliest",
        # Commit only after the proposal is published; a bad token or body is dead-lettered
        # and acked by `guarded`, a Kafka outage (retryable) redelivers.
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=handling.raw_body, parser=handling.tolerant_parser,
    )(handling.guarded(broker, on_gateway_proposal, payload_topic=True))
