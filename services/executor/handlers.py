"""The executor's batch handler: claim durably, ack, complete the call in the background."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import confluent_kafka

from agentledger import errors
from agentledger.contracts.exec import ExecRequestV1
from agentledger.executor import dispatcher, inflight
from agentledger.kafka import batch, handling
from agentledger.ledger import dispatch, repository

log = logging.getLogger(__name__)

Item = tuple[ExecRequestV1, str | None]


def handler(work: dispatcher.Dispatcher, running: inflight.InFlight) -> batch.Handler[Item]:
    """Exec records in; nothing out but dead letters. Records of one operation are claimed
    in offset order, all others concurrently (bounded by ``running``'s free slots)."""

    def parse(msg: confluent_kafka.Message) -> Item:
        request = ExecRequestV1.model_validate_json(msg.value() or b"")  # poison → DLQ
        traceparent = handling.raw_headers(msg).get("traceparent")
        return request, traceparent.decode() if traceparent else None

    async def handle(item: Item, msg: confluent_kafka.Message) -> Sequence[batch.Output]:
        request, trace = item
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
            return ()  # terminal or held by a live claim: its recorded result stands
        # Durably claimed: acking now is safe (R5.7); a crash from here on leaves a lease
        # for the reconciler, never a lost command.
        running.spawn(_complete(work, begun.claim, trace))
        return ()

    def chain(item: Item) -> uuid.UUID:
        return item[0].operation_id

    return batch.Handler(parse, handle, chain)


async def _complete(work: dispatcher.Dispatcher, claim: dispatch.Claim, trace: str | None) -> None:
    try:
        await work.complete(claim, traceparent=trace)
    except errors.StaleClaim:
        # Fenced out: another worker owns the command now; our outcome is not recorded.
        log.warning("event=fenced_out operation_id=%s", claim.operation_id)


# How long a record whose transaction is committed but invisible is retried before it is
# dead-lettered (a synchronous standby that never answers is an outage an operator sees).
NOT_VISIBLE_GRACE_S = 60.0


async def _not_in_ledger(work: dispatcher.Dispatcher, msg: confluent_kafka.Message) -> None:
    """A record naming no command: dead-letter it — unless the relay says which transaction
    wrote it and that transaction is not visible yet (a commit waiting for a synchronous
    standby streams before it is visible), then redeliver, for a bounded time (issue 18).
    The batch runner pauses between redeliveries.

    Raises:
        errors.NotInLedgerYet: retryable: redelivered after a short pause.
        errors.PoisonMessage: no such command, for good.
    """
    raw = handling.raw_headers(msg).get("xid")
    xid = int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 else None
    age_s = time.time() - msg.timestamp()[1] / 1000
    if xid is not None and age_s < NOT_VISIBLE_GRACE_S:
        async with work.pool.acquire() as conn:
            visible = await repository.xid_visible(conn, xid)
        if not visible:
            log.warning("event=exec_not_visible_yet xid=%d age_s=%.1f", xid, age_s)
            raise errors.NotInLedgerYet("the command's transaction is not visible yet", xid=xid)
    raise errors.PoisonMessage("no such command in the ledger")
