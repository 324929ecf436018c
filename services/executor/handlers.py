"""The executor's subscriber: claim durably, ack, complete the call in the background."""

# No `from __future__ import annotations`: FastStream reads handler annotations at runtime.

import logging

from faststream import AckPolicy
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import errors
from agentledger.contracts.exec import ExecRequestV1
from agentledger.executor import dispatcher, inflight
from agentledger.kafka import handling
from agentledger.ledger import dispatch

log = logging.getLogger(__name__)


def register(
    broker: KafkaBroker, work: dispatcher.Dispatcher, running: inflight.InFlight, *,
    topic: str, group_id: str, group_instance_id: str | None = None,
    session_timeout_ms: int = 10_000,
) -> None:
    async def on_exec(msg: KafkaMessage) -> None:
        request = ExecRequestV1.model_validate_json(msg.body)  # poison → DLQ via `guarded`
        traceparent = handling.headers_of(msg).get("traceparent")
        trace = traceparent.decode() if traceparent else None
        await running.reserve()
        try:
            begun = await work.begin(request.tenant_id, request.operation_id, traceparent=trace)
        except BaseException:
            running.cancel_reservation()
            raise  # retryable storage errors redeliver; nothing was claimed
        if begun.claim is None:
            running.cancel_reservation()
            if begun.disposition == "missing":
                raise errors.PoisonMessage("no such command in the ledger")
            log.info("event=exec_skipped operation_id=%s disposition=%s state=%s",
                     request.operation_id, begun.disposition, begun.state)
            return  # terminal or held by a live claim: its recorded result stands
        # Durably claimed: acking now is safe (R5.7); a crash from here on leaves a lease
        # for the reconciler, never a lost command.
        running.spawn(_complete(work, begun.claim, trace))

    broker.subscriber(
        topic, group_id=group_id, auto_offset_reset="earliest",
        group_instance_id=group_instance_id, session_timeout_ms=session_timeout_ms,
        # Commit after the claim committed; redeliver on retryable errors; poison → DLQ.
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=handling.raw_body, parser=handling.tolerant_parser,
    )(handling.guarded(broker, on_exec))


async def _complete(work: dispatcher.Dispatcher, claim: dispatch.Claim, trace: str | None) -> None:
    try:
        await work.complete(claim, traceparent=trace)
    except errors.StaleClaim:
        # Fenced out: another worker owns the command now; our outcome is not recorded.
        log.warning("event=fenced_out operation_id=%s", claim.operation_id)
