"""Accept a gateway's request or proposal: verify the session, fix the operation id, sign the
identity envelope, publish. Shared by the HTTP routes and the ``gateway.proposals.v1`` entry.

Runs: the envelope's request id is the workflow whose budgets (R7) the work spends. A
request, and a proposal that names no run, is its own workflow (its own id). A proposal that
names a run (``AgentLedger-Run``) binds the run id ``identity.derive_run_id`` gives for the
session's tenant and principal and that name, so every step of the run spends one budget and
no other tenant or principal can spend it. A request cannot name a run: the planner derives
its proposal's id from the request id (``identity.planned_proposal_id``), which must stay the
request's own.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import pydantic
from faststream.confluent import KafkaBroker

from agentledger import db, errors, identity, web
from agentledger.contracts import common, proposals, requests
from agentledger.ledger import repository
from agentledger.services.ingress import models

log = logging.getLogger(__name__)



def trace_headers(incoming: Mapping[str, str | bytes]) -> dict[str, str]:
    """W3C trace headers for what ingress publishes: a child of the caller's, or a new trace."""
    try:
        parent = common.TraceContext.from_headers(incoming)
    except pydantic.ValidationError:
        parent = None
    span = secrets.token_hex(8)
    if parent is None:
        return {"traceparent": f"00-{secrets.token_hex(16)}-{span}-01"}
    _, trace_id, _, flags = parent.traceparent.split("-")[:4]
    headers = {"traceparent": f"00-{trace_id}-{span}-{flags}"}
    if parent.tracestate:
        headers["tracestate"] = parent.tracestate
    return headers


class ConflictCheck:
    """Ingress' one question to the ledger: does this operation id already hold a command
    with another request hash? (issue 18 §2: a conflict knowable at once is answered 409.)

    Fails open: admission stays the authority and answers ``conflict`` anyway, so a ledger
    that is down or slow (``timeout_s``) costs the caller the early answer, never a request.
    """

    def __init__(self, database_url: str, timeout_s: float) -> None:
        self.database_url, self.timeout_s = database_url, timeout_s
        self.pool: asyncpg.Pool | None = None

    async def start(self) -> None:
        # min_size=0: no connection at start-up, so ingress starts while the ledger is away.
        self.pool = await db.create_pool(self.database_url, role=None, size=4, min_size=0,
                                         command_timeout=self.timeout_s)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def held(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> bytes | None:
        """The hash the operation holds; ``None`` if none, or if the ledger did not answer."""
        if self.pool is None:
            return None
        try:
            async with asyncio.timeout(self.timeout_s), self.pool.acquire() as conn:
                return await repository.admitted_hash(conn, tenant_id, operation_id)
        except (asyncpg.PostgresError, OSError, TimeoutError) as exc:
            log.warning("event=conflict_check_skipped reason=%s", type(exc).__name__)
            return None


@dataclass(frozen=True)
class Intake:
    """Everything ingress needs to accept work; holds verification keys and its signer only."""

    broker: KafkaBroker
    session_keys: identity.KeySet
    session_issuer: str
    session_audience: str
    signer: identity.EnvelopeSigner
    requests_topic: str
    proposals_topic: str
    publish_timeout_s: float
    conflicts: ConflictCheck | None = None

    def authenticate(self, authorization: str | bytes | None) -> identity.Session:
        """Verify the caller's session token.

        Raises:
            errors.IdentityRejected: Missing, forged, expired or otherwise invalid.
        """
        return identity.verify_session(web.bearer(authorization), self.session_keys,
                                       audience=self.session_audience,
                                       issuer=self.session_issuer)

    def operation_id(self, session: identity.Session, key: str | None) -> uuid.UUID:
        return identity.submission_ids(session.tenant_id, session.principal_id, key)[0]

    def run_id(self, session: identity.Session, run: str | None) -> uuid.UUID | None:
        """The id of the run ``run`` names for this session, ``None`` without a run.

        Raises:
            errors.ValidationFailed: ``run`` is not a run name.
        """
        if run is None:
            return None
        return identity.derive_run_id(session.tenant_id, session.principal_id, run)

    async def submit_request(self, session: identity.Session, body: models.RequestBody,
                             key: str | None, trace: Mapping[str, str | bytes], *,
                             run: str | None = None) -> models.Accepted:
        """Publish a request to plan (its own run).

        Raises:
            errors.ValidationFailed: ``run`` is given (nothing is published).
            errors.StorageError: Kafka did not acknowledge.
        """
        if run is not None:
            raise errors.ValidationFailed(
                "AgentLedger-Run names a run of proposals (POST /v1/proposals); a request to "
                "plan is its own run. Nothing was published.")
        operation_id, request_id = self.operation_id(session, key), uuid.uuid4()
        message = requests.RequestV1(
            request_id=request_id, tenant_id=session.tenant_id,
            principal_id=session.principal_id, operation_id=operation_id, goal=body.goal,
            resource=body.resource,
            identity=self._envelope(session, operation_id, request_id, identity.request_binding(
                goal=body.goal, resource=body.resource)),
            created_at=datetime.now(UTC),
        )
        await self._publish(self.requests_topic, message, session, trace)
        log.info("event=request_accepted tenant=%s operation_id=%s", session.tenant_id,
                 operation_id)
        return models.Accepted(operation_id=operation_id, tenant_id=session.tenant_id,
                               request_id=request_id)

    async def refuse_known_conflict(self, session: identity.Session, body: models.ProposalBody,
                                    key: str | None) -> None:
        """Refuse, before anything is published, a keyed proposal whose operation id already
        holds a command with other content (the ``IdempotencyConflict`` promise: HTTP 409).

        The same digest admission stores (``canonical.request_hash`` over the fields as
        submitted, which the allowlist's validation never rewrites). A resubmission with the
        same content passes: admission answers it as a replay.

        Raises:
            errors.IdempotencyConflict: The operation holds a command with another hash.
        """
        if self.conflicts is None or key is None:
            return
        operation_id = self.operation_id(session, key)
        held = await self.conflicts.held(session.tenant_id, operation_id)
        if held is None:
            return
        digest = bytes.fromhex(identity.proposal_binding(
            tenant_id=session.tenant_id, principal_id=session.principal_id, action=body.action,
            target=body.target, arguments=body.arguments,
            expected_revision=body.expected_revision).digest)
        if not hmac.compare_digest(held, digest):
            log.info("event=proposal_conflict tenant=%s operation_id=%s", session.tenant_id,
                     operation_id)
            raise errors.IdempotencyConflict(
                "this Idempotency-Key was already used for a different proposal; nothing was "
                "published (use a new key for new content)", operation_id=str(operation_id))

    async def submit_proposal(self, session: identity.Session, body: models.ProposalBody,
                              key: str | None, trace: Mapping[str, str | bytes], *,
                              record: tuple[str, int, int] | None = None,
                              run: str | None = None
                              ) -> models.Accepted:
        """Publish a gateway's proposal, a step of ``run`` when one is named.

        Raises:
            errors.ValidationFailed: ``run`` is not a run name (nothing is published).
            errors.StorageError: Kafka did not acknowledge.
        """
        run_id = self.run_id(session, run)
        operation_id, proposal_id = identity.submission_ids(
            session.tenant_id, session.principal_id, key, record=record)
        binding = identity.proposal_binding(
            tenant_id=session.tenant_id, principal_id=session.principal_id, action=body.action,
            target=body.target, arguments=body.arguments,
            expected_revision=body.expected_revision)
        message = proposals.ProposalV1(
            proposal_id=proposal_id, tenant_id=session.tenant_id,
            principal_id=session.principal_id, operation_id=operation_id, action=body.action,
            arguments=body.arguments, target=body.target,
            expected_revision=body.expected_revision, evidence_refs=body.evidence_refs,
            planner=proposals.PlannerInfo(name="gateway"),
            # The workflow admission reserves tool calls in: the run's, else its own.
            identity=self._envelope(session, operation_id, run_id or proposal_id, binding),
            created_at=datetime.now(UTC),
        )
        await self._publish(self.proposals_topic, message, session, trace)
        log.info("event=proposal_accepted tenant=%s operation_id=%s run_id=%s",
                 session.tenant_id, operation_id, run_id)
        return models.Accepted(operation_id=operation_id, tenant_id=session.tenant_id,
                               proposal_id=proposal_id, run_id=run_id)

    def _envelope(self, session: identity.Session, operation_id: uuid.UUID,
                  request_id: uuid.UUID, binding: identity.Binding) -> str:
        # Bound to the content as accepted: a copy of the envelope admits nothing else
        # (a replay with a new amount is refused by admission).
        return self.signer.sign(tenant_id=session.tenant_id, principal_id=session.principal_id,
                                operation_id=operation_id, request_id=request_id,
                                binding=binding, roles=session.roles)

    async def _publish(self, topic: str, message: pydantic.BaseModel,
                       session: identity.Session, trace: Mapping[str, str | bytes]) -> None:
        try:
            await asyncio.wait_for(self.broker.publish(
                message.model_dump_json(by_alias=True).encode(), topic=topic,
                key=str(session.tenant_id).encode(), headers=trace_headers(trace),
            ), timeout=self.publish_timeout_s)
        except Exception as exc:
            log.warning("event=publish_failed topic=%s error=%s", topic, type(exc).__name__)
            raise errors.StorageError("the message bus did not acknowledge the message") from exc
