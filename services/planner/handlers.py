"""Subscriber of the planner: thin; the work is in ``agentledger.planning.proposer``."""

# No `from __future__ import annotations`: FastStream reads handler annotations at runtime.

from datetime import UTC, datetime
from typing import Protocol

from faststream import AckPolicy
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import identity
from agentledger.contracts import admission, common, topics
from agentledger.contracts.proposals import ProposalV1
from agentledger.contracts.requests import RequestV1
from agentledger.kafka import handling
from agentledger.planning import adapters


class Planner(Protocol):
    """Production's proposer, or the shadow planner wrapping it."""

    async def propose(self, request: RequestV1) -> ProposalV1 | adapters.Refusal: ...


def register(broker: KafkaBroker, planner: Planner, *, group_id: str,
             requests_topic: str, proposals_topic: str,
             admissions_topic: str = topics.ADMISSIONS) -> None:
    """Subscribe to ``agent.requests.v1``; proposals go to ``agent.proposals.v1``."""

    async def on_request(msg: KafkaMessage) -> None:
        request = RequestV1.model_validate_json(msg.body)  # poison → DLQ via `guarded`
        trace = common.TraceContext.from_headers(handling.headers_of(msg))
        result = await planner.propose(request)
        if isinstance(result, adapters.Refusal):
            # Nothing to admit; the gateway still gets an answer for its operation id.
            answer = admission.AdmissionResultV1(
                tenant_id=request.tenant_id, operation_id=request.operation_id,
                proposal_id=identity.planned_proposal_id(request.request_id),
                status="rejected", reason_code=f"plan_{result.code}"[:64],
                reason=result.reason[:2000] or result.code, decided_at=datetime.now(UTC))
            await broker.publish(answer.model_dump_json(by_alias=True).encode(),
                                 topic=admissions_topic, key=str(request.tenant_id).encode())
            return
        headers = {k: v.decode() for k, v in trace.to_headers().items()} if trace else None
        await broker.publish(
            result.model_dump_json(by_alias=True).encode(), topic=proposals_topic,
            key=str(result.tenant_id).encode(), headers=headers,
        )

    broker.subscriber(
        requests_topic, group_id=group_id, auto_offset_reset="earliest",
        # Commit only after the proposal is published; retrieval or model outages
        # (retryable) redeliver, invalid requests and envelopes are dead-lettered.
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=handling.raw_body, parser=handling.tolerant_parser,
    )(handling.guarded(broker, on_request, payload_topic=True))
