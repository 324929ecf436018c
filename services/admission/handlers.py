"""Admission's batch handler: thin; the rules are in ``agentledger.admission``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import confluent_kafka

from agentledger import admission
from agentledger.contracts import common
from agentledger.contracts.proposals import ProposalV1
from agentledger.kafka import batch, handling

Item = tuple[ProposalV1, common.TraceContext | None]


def handler(admitter: admission.Admitter, admissions_topic: str) -> batch.Handler[Item]:
    """Proposals in, one admission result out per proposal (on ``admissions_topic``).

    Proposals with the same operation id are admitted in offset order (the first one wins,
    the next is its replay or conflict); all others concurrently.
    """

    def parse(msg: confluent_kafka.Message) -> Item:
        proposal = ProposalV1.model_validate_json(msg.value() or b"")  # poison → DLQ
        return proposal, common.TraceContext.from_headers(handling.raw_headers(msg))

    async def handle(item: Item, _msg: confluent_kafka.Message) -> Sequence[batch.Output]:
        proposal, trace = item
        result = await admitter.admit(proposal, trace=trace)
        return (batch.Output(
            admissions_topic, result.model_dump_json(by_alias=True).encode(),
            str(proposal.tenant_id).encode(),
            tuple(trace.to_headers().items()) if trace else ()),)

    def chain(item: Item) -> uuid.UUID:
        return item[0].operation_id

    return batch.Handler(parse, handle, chain, payload_topic=True)
