"""Subscribers of the admission service: thin; the rules are in ``agentledger.admission``."""

# No `from __future__ import annotations`: FastStream reads handler annotations at runtime.

from faststream import AckPolicy
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import admission
from agentledger.contracts import common, topics
from agentledger.contracts.proposals import ProposalV1
from agentledger.kafka import handling


def register(
    broker: KafkaBroker, admitter: admission.Admitter, *, group_id: str,
    proposals_topic: str = topics.PROPOSALS, admissions_topic: str = topics.ADMISSIONS,
    group_instance_id: str | None = None, session_timeout_ms: int = 10_000,
) -> None:
    """Subscribe admission to ``agent.proposals.v1``; answers go to ``agent.admissions.v1``."""

    async def on_proposal(msg: KafkaMessage) -> None:
        proposal = ProposalV1.model_validate_json(msg.body)  # poison → DLQ via `guarded`
        trace = common.TraceContext.from_headers(handling.headers_of(msg))
        result = await admitter.admit(proposal, trace=trace)
        await broker.publish(
            result.model_dump_json(by_alias=True).encode(), topic=admissions_topic,
            key=str(proposal.tenant_id).encode(),
        )

    broker.subscriber(
        proposals_topic,
        group_id=group_id,
        group_instance_id=group_instance_id,
        session_timeout_ms=session_timeout_ms,
        auto_offset_reset="earliest",
        # Commit only after the handler (and its publish) succeeded; on a retryable error
        # seek back and redeliver. Poison messages are dead-lettered and acked by `guarded`.
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=handling.raw_body, parser=handling.tolerant_parser,
    )(handling.guarded(broker, on_proposal, payload_topic=True))
