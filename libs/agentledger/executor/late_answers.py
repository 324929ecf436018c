"""Recording what a provider answered a claim the worker no longer holds (issue 37 §3).

The answer has one copy, in this process: it is recorded on its attempt and weighed against
the command (``agentledger.ledger.late``), counted, and logged — a contradiction as an
error; a database blip is ridden out for a bounded time, then the loss is logged, never
silent.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from agentledger import errors
from agentledger.connectors import base
from agentledger.ledger import dispatch, late
from agentledger.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

# Bounded names of what a call returned (span attribute, metric label, the attempt's record).
RESULTS: dict[type, late.Kind] = {
    base.Applied: "applied", base.PreconditionFailed: "precondition_failed",
    base.Refused: "refused", base.Fenced: "fenced", base.NotSent: "not_sent",
    base.InDoubt: "in_doubt"}
# Recording outlives a database blip of up to about half a minute (backoff 0.5 s doubling).
TRIES = 6


async def record(pool: asyncpg.Pool, held: dispatch.Claim, result: base.Result,
                 connector: str, traceparent: str | None) -> None:
    """Record the answer ``held`` received after its claim was taken, and weigh it."""
    kind = RESULTS[type(result)]
    answer = late.Answer(
        kind, text=getattr(result, "reason", None) or f"the provider answered {kind}",
        receipt=result.receipt if isinstance(result, base.Applied) else None)
    for tries in range(1, TRIES + 1):
        try:
            async with pool.acquire() as conn:
                weighed = await late.record(
                    conn, held.tenant_id, held.operation_id, held.attempt_id, answer,
                    worker_id=held.worker_id, traceparent=traceparent)
            break
        except (errors.AgentLedgerError, OSError, asyncpg.PostgresError,
                asyncpg.InterfaceError) as exc:
            if tries == TRIES or not getattr(exc, "retryable", True):
                log.error("event=late_answer_lost operation_id=%s generation=%d answer=%s "
                          "error=%r", held.operation_id, held.generation, kind, exc)
                return
            await asyncio.sleep(0.5 * 2 ** (tries - 1))  # backoff across a blip
    label = telemetry_metrics.bounded(connector)
    telemetry_metrics.late_answers.add(1, connector=label, outcome=kind)
    log.warning("event=late_answer operation_id=%s generation=%d answer=%s state=%s "
                "disposition=%s", held.operation_id, held.generation, kind, weighed.state,
                weighed.disposition)
    if weighed.disposition == "contradicted":
        telemetry_metrics.contradictions.add(1, connector=label)
        log.error("event=contradicted operation_id=%s state=%s answer=%s",
                  held.operation_id, weighed.state, kind)
