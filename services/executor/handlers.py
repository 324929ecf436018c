"""The executor's subscriber: claim durably, ack, complete the call in the background."""

# No `from __future__ import annotations`: FastStream reads handler annotations at runtime.

import asyncio
import logging
import time

import confluent_kafka
from faststream import AckPolicy
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import errors
from agentledger.contracts.exec import ExecRequestV1
from agentledger.executor import dispatcher, inflight
from agentledger.kafka import handling
from agentledger.ledger import dispatch, repository

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
                await _not_in_ledger(work, msg)
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


# How long a record whose transaction is committed but invisible is retried before it is
# dead-lettered (a synchronous standby that never answers is an outage an operator sees).
NOT_VISIBLE_GRACE_S = 60.0


async def _not_in_ledger(work: dispatcher.Dispatcher, msg: KafkaMessage) -> None:
    """A record naming no command: dead-letter it — unless the relay says which transaction
    wrote it and that transaction is not visible yet (a commit waiting for a synchronous
    standby streams before it is visible), then redeliver, for a bounded time (issue 18).

    Raises:
        errors.NotInLedgerYet: retryable: redelivered after a short pause.
        errors.PoisonMessage: no such command, for good.
    """
    raw = handling.headers_of(msg).get("xid")
    xid = int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 else None
    record = msg.raw_message
    if not isinstance(record, confluent_kafka.Message):
        raise TypeError("batch messages are not supported")
    age_s = time.time() - record.timestamp()[1] / 1000
    if xid is not None and age_s < NOT_VISIBLE_GRACE_S:
        async with work.pool.acquire() as conn:
            visible = await repository.xid_visible(conn, xid)
        if not visible:
            log.warning("event=exec_not_visible_yet xid=%d age_s=%.1f", xid, age_s)
            await asyncio.sleep(0.2)  # a pause between redeliveries, not a wait for a state
            raise errors.NotInLedgerYet("the command's transaction is not visible yet", xid=xid)
    raise errors.PoisonMessage("no such command in the ledger")
