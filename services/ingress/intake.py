"""Accept a gateway's request or proposal: verify the session, fix the operation id, sign the
identity envelope, publish. Shared by the HTTP routes and the ``gateway.proposals.v1`` entry.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pydantic
from faststream.confluent import KafkaBroker

from agentledger import errors, identity
from agentledger.contracts import common, proposals, requests
from agentledger.services.ingress import models

log = logging.getLogger(__name__)



def bearer(authorization: str | bytes | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value.

    Raises:
        errors.IdentityRejected: No bearer token.
    """
    text = authorization.decode("latin-1") if isinstance(authorization, bytes) else authorization
    scheme, _, token = (text or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise errors.IdentityRejected("a bearer session token is required")
    return token.strip()


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

    def authenticate(self, authorization: str | bytes | None) -> identity.Session:
        """Verify the caller's session token.

        Raises:
            errors.IdentityRejected: Missing, forged, expired or otherwise invalid.
        """
        return identity.verify_session(bearer(authorization), self.session_keys,
                                       audience=self.session_audience,
                                       issuer=self.session_issuer)

    def operation_id(self, session: identity.Session, key: str | None,
                     record_seed: str | None = None) -> uuid.UUID:
        if key is not None:
            return identity.derive_operation_id(session.tenant_id, session.principal_id, key)
        if record_seed is not None:
            return uuid.uuid5(identity.RECORD_NAMESPACE, record_seed)
        return uuid.uuid4()

    async def submit_request(self, session: identity.Session, body: models.RequestBody,
                             key: str | None, trace: Mapping[str, str | bytes]
                             ) -> models.Accepted:
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

    async def submit_proposal(self, session: identity.Session, body: models.ProposalBody,
                              key: str | None, trace: Mapping[str, str | bytes], *,
                              record_seed: str | None = None) -> models.Accepted:
        operation_id = self.operation_id(session, key, record_seed)
        proposal_id = (uuid.uuid5(identity.RECORD_NAMESPACE, f"proposal:{record_seed}")
                       if record_seed is not None else uuid.uuid4())
        message = proposals.ProposalV1(
            proposal_id=proposal_id, tenant_id=session.tenant_id,
            principal_id=session.principal_id, operation_id=operation_id, action=body.action,
            arguments=body.arguments, target=body.target,
            expected_revision=body.expected_revision, evidence_refs=body.evidence_refs,
            planner=proposals.PlannerInfo(name="gateway"),
            identity=self._envelope(session, operation_id, proposal_id, identity.proposal_binding(
                tenant_id=session.tenant_id, principal_id=session.principal_id,
                action=body.action, target=body.target, arguments=body.arguments,
                expected_revision=body.expected_revision)),
            created_at=datetime.now(UTC),
        )
        await self._publish(self.proposals_topic, message, session, trace)
        log.info("event=proposal_accepted tenant=%s operation_id=%s", session.tenant_id,
                 operation_id)
        return models.Accepted(operation_id=operation_id, tenant_id=session.tenant_id,
                               proposal_id=proposal_id)

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
