"""Recovery by contract (R5.5, R6.4): expired leases and unknown outcomes.

An expired lease does not prove the worker stopped. The reconciler takes the command over
(a new claim token and fencing generation: the old holder can no longer finalize) and then
follows the connector's declared contract:

- ``keyed`` with lookup: ask the provider by key. Found → ``succeeded`` with its receipt. Not
  found → requeue: the executor sends the identical request with the same key (a late
  original is deduped by the provider). No answer → ``unknown``, looked up again next sweep.
- ``keyed`` without lookup, ``replay_safe``: requeue (resending the same key is safe).
- ``none``: ``unknown``; only an operator can resolve it. Nothing is ever resent.

A connector that declares fencing has its provider's fence advanced to the take-over's
generation *before* anything is looked up or decided (issue 37): a stalled earlier worker's
call is then refused by the provider instead of landing after the ledger decided without it.

Every recovery path is bounded (R7.5, R14.3): a take-over at the generation cap holds the
command as ``unknown`` for an operator, and one item's failure is counted and logged without
ending the sweep (the item is tried again next period, within its cap).

And one more case, for a loss it cannot otherwise see: a command still ``pending`` long
after admission whose outbox row is gone was published and never claimed — its Kafka
record was lost after the broker acknowledged it, or no executor consumes its topic. Its
obligation is republished (nothing was ever sent for it, and executors claim a command
once). Last, late ``applied`` answers that crossed a decision are weighed again
(:mod:`agentledger.ledger.late`).

It never calls a write API and never the planner (R6.5): its credential is lookup-only
(advancing a fence applies nothing; the provider accepts it under that scope).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal
from uuid import UUID

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agentledger import errors, faults
from agentledger.approvals import repository as approvals
from agentledger.connectors import base, boundary
from agentledger.contracts import common
from agentledger.ledger import dispatch, late, repository
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentledger.reconciler")

# A lookup is one read; the lease only needs to cover it and the bookkeeping.
LEASE_S = 30.0

Action = Literal["succeeded", "requeued", "unknown", "skipped", "republished", "retried",
                 "failed", "settled", "contradicted"]
# Far longer than relay lag plus executor backlog in normal operation: a renewal is a
# diagnosis (a record was lost), not a retry loop.
STRANDED_AFTER_S = 300.0
# Take-overs past the generation cap before the reconciler stops taking a `dispatching`
# command over: a take-over at the cap records `unknown`, so only a recording that keeps
# failing gets here; a few more tries cover a database blip, then the loop ends (R7.5).
RECOVERY_SLACK = 3


@dataclass
class Reconciler:
    pool: asyncpg.Pool
    connectors: Mapping[str, base.Connector]
    credentials: base.Credentials  # lookup scope
    worker_id: str
    lease_s: float = LEASE_S
    stranded_after_s: float = STRANDED_AFTER_S
    max_generations: int = dispatch.MAX_GENERATIONS

    async def sweep(self, *, limit: int = 100) -> dict[UUID, Action]:
        """One pass over every command that needs recovery; returns what was done.

        Pending approvals past their expiry are expired first (audited), so nobody can
        approve them later (R2.3). Last, the ``unknown`` backlog is counted for its gauges.
        """
        async with self.pool.acquire() as conn:
            expired = await approvals.expire_due(conn, limit=limit)
            if expired:
                log.info("event=approvals_expired count=%d", len(expired))
            todo = await dispatch.needs_reconciliation(
                conn, limit=limit,
                lookup_connectors=[n for n, c in self.connectors.items() if c.contract.lookup],
                max_generations=self.max_generations)
        done: dict[UUID, Action] = {}
        for item in todo:
            try:
                done[item["operation_id"]] = await self.reconcile(
                    item["tenant_id"], item["operation_id"], item["connector"], item["state"])
            except errors.StaleClaim:
                done[item["operation_id"]] = "skipped"
            except Exception as exc:  # one item never ends the sweep (R14.3)
                done[item["operation_id"]] = self._failed(item, exc)
        await self._republish_stranded(done, limit)
        await self._weigh_late_answers(done, limit)
        await self.count_unknown()
        return done

    @staticmethod
    def _failed(item: dict[str, object], exc: Exception) -> Action:
        """One item of a sweep raised: counted and logged; the sweep goes on, the item is
        tried again next period (its take-overs count against its generation cap)."""
        telemetry_metrics.sweep_failures.add(
            1, connector=telemetry_metrics.bounded(str(item.get("connector"))))
        log.error("event=reconcile_item_failed operation_id=%s connector=%s error=%s",
                  item.get("operation_id"), item.get("connector"), type(exc).__name__,
                  exc_info=exc)
        return "failed"

    async def _weigh_late_answers(self, done: dict[UUID, Action], limit: int) -> None:
        """Late ``applied`` answers whose own record crossed a decision: settle the ``unknown``
        ones, mark the contradicted ones (``ledger.late``)."""
        async with self.pool.acquire() as conn:
            todo = await late.late_applied(conn, limit=limit)
        for item in todo:
            try:
                async with self.pool.acquire() as conn:
                    weighed = await late.weigh(conn, item["tenant_id"], item["operation_id"])
            except Exception as exc:  # one item never ends the sweep
                done[item["operation_id"]] = self._failed(item, exc)
                continue
            if weighed is None or weighed.disposition not in ("settled", "contradicted"):
                continue
            done[item["operation_id"]] = weighed.disposition
            label = telemetry_metrics.bounded(weighed.connector)
            if weighed.disposition == "contradicted":
                telemetry_metrics.contradictions.add(1, connector=label)
                log.error("event=contradicted operation_id=%s state=%s",
                          item["operation_id"], weighed.state)
            else:
                log.info("event=settled_by_late_answer operation_id=%s", item["operation_id"])

    async def count_unknown(self) -> None:
        """Count the ``unknown`` backlog per connector, across tenants, for the gauges the
        alerts read (``agentledger.commands.unknown``, ``…unknown.oldest_age``): after the
        sweep's recoveries, so a command settled by lookup is no longer counted."""
        async with self.pool.acquire() as conn:
            backlog = await dispatch.unknown_backlog(conn)
        telemetry_metrics.unknown_backlog.update(backlog, served=self.connectors)

    async def _republish_stranded(self, done: dict[UUID, Action], limit: int) -> None:
        async with self.pool.acquire() as conn:
            stranded = await dispatch.stranded_pending(
                conn, older_than_s=self.stranded_after_s, limit=limit)
        for item in stranded:
            retry = item["retry_at"] is not None
            try:
                async with self.pool.acquire() as conn:
                    with spans.span(tracer, "republish", context=spans.ROOT, attributes={
                            spans.OPERATION_ID: str(item["operation_id"]),
                            spans.CONNECTOR: item["connector"]}):
                        renewed = await dispatch.republish(
                            conn, item["tenant_id"], item["operation_id"],
                            older_than_s=self.stranded_after_s,
                            traceparent=spans.traceparent_of(), retry_due=retry)
            except Exception as exc:  # one item never ends the sweep
                done[item["operation_id"]] = self._failed(item, exc)
                continue
            if renewed and retry:
                # A requeue's backoff ran out: routine, not a lost record.
                done[item["operation_id"]] = "retried"
                log.info("event=retry_due operation_id=%s connector=%s",
                         item["operation_id"], item["connector"])
            elif renewed:
                done[item["operation_id"]] = "republished"
                telemetry_metrics.reconciliations.add(
                    1, connector=telemetry_metrics.bounded(item["connector"]),
                    outcome="republished")
                log.warning("event=republished operation_id=%s connector=%s",
                            item["operation_id"], item["connector"])

    async def reconcile(
        self, tenant_id: UUID, operation_id: UUID, connector_name: str, state: str
    ) -> Action:
        """Recover one command; its ``reconciliation`` span (a new trace) links to the
        original dispatch through the context recorded on the command's attempts."""
        connector = self.connectors.get(connector_name)
        if connector is None or (state == "unknown" and not connector.contract.lookup):
            return "skipped"  # swept every period until an operator acts: no span each time
        with spans.span(tracer, "reconciliation", context=spans.ROOT, attributes={
                spans.OPERATION_ID: str(operation_id), spans.CONNECTOR: connector_name,
                spans.STATE: state}) as span:
            async with self.pool.acquire() as conn:
                tried = await dispatch.attempts(conn, tenant_id, operation_id)
            first = next((a for a in tried if a["traceparent"] and a["kind"] == "dispatch"),
                         None)
            spans.add_link(span, first["traceparent"] if first else None, "dispatch")
            done = await self._reconcile(tenant_id, operation_id, connector_name, state)
            span.set_attribute(spans.OUTCOME, done)
        telemetry_metrics.reconciliations.add(
            1, connector=telemetry_metrics.bounded(connector_name), outcome=done)
        return done

    async def _reconcile(
        self, tenant_id: UUID, operation_id: UUID, connector_name: str, state: str
    ) -> Action:
        connector = self.connectors.get(connector_name)
        if connector is None:
            return "skipped"
        contract = connector.contract
        if state == "unknown" and not contract.lookup:
            return "skipped"  # waits for an operator; nothing automatic is safe
        if state == "unknown":
            async with self.pool.acquire() as conn:
                before = await dispatch.attempts(conn, tenant_id, operation_id)
            if dispatch.looked_up_past_retention(before, contract.retention):
                return "skipped"  # concluded past the key's retention: an operator's now
        if state == "dispatching":
            async with self.pool.acquire() as conn:
                before = await dispatch.attempts(conn, tenant_id, operation_id)
                current = await repository.load_command(conn, tenant_id, operation_id)
            if dispatch.may_still_act(before, current["lease_until"]):
                # A stalled holder may still send: take nothing over and declare nothing
                # until the call bound its mark covered has run out past the lease (next
                # passes).
                return "skipped"
            if current["fencing_generation"] >= self.max_generations + RECOVERY_SLACK:
                # Take-overs at the cap keep failing to record (each pass raised): stop taking
                # generations; the failures are counted and alerted, an operator looks.
                log.error("event=recovery_exhausted operation_id=%s generation=%d",
                          operation_id, current["fencing_generation"])
                return "skipped"
        async with self.pool.acquire() as conn:
            held = await dispatch.claim(conn, tenant_id, operation_id, worker_id=self.worker_id,
                                        lease_s=self.lease_s, take_over=True,
                                        kind="lookup" if contract.lookup else "resend",
                                        traceparent=spans.traceparent_of())
            if held is None:
                return "skipped"
            if held.previous_state == "dispatching":
                # Its holder's lease ran out mid-command: the take-over is the expiry's proof.
                telemetry_metrics.leases_expired.add(
                    1, connector=telemetry_metrics.bounded(connector_name))
            tried = await dispatch.attempts(conn, tenant_id, operation_id)
            unsent = held.previous_state == "dispatching" and dispatch.never_sent(
                tried, held.generation - 1)
            row = await repository.load_command(conn, tenant_id, operation_id)
        expired = dispatch.past_retention(tried, contract.retention)
        if unsent:
            # Its holder stopped before any call reached the connector (crashed, cut off, or
            # fenced at the pre-call check): nothing to look up or doubt, whatever the
            # contract — send it again, never `unknown`.
            return await self._requeue(held, connector_name, "the lease expired before any "
                                       "call reached the connector: nothing was sent")
        call = base.Call(tenant_id, operation_id, row["action"], row["resource_id"], {},
                         row["expected_revision"])
        # Before anything is looked up or decided, the provider refuses the earlier holder's
        # generation (a stalled worker's late call): the storage fences, not the worker.
        fenced = await self._fence(connector, held, call)
        capped = held.generation >= self.max_generations
        if contract.lookup:
            token = self.credentials.token(connector.name, tenant_id)
            found: base.Lookup
            if token is None:
                found = base.InDoubt("no lookup credential for this tenant")
            else:
                await faults.point("reconciler.mid_lookup")
                with spans.span(tracer, "lookup", kind=SpanKind.CLIENT, attributes={
                        spans.CONNECTOR: connector.name, spans.GENERATION: held.generation}):
                    found = await boundary.lookup(connector, call, token,
                                                  bound_s=contract.call_timeout_s)
            if isinstance(found, base.Applied):
                await self._finalize(held, "succeeded", receipt=found.receipt)
                return "succeeded"
            if isinstance(found, base.NotFound) and contract.may_resend and expired:
                # The provider forgot the key (or will before a resend lands): "not found"
                # no longer means "not done", and a resend would be a second effect.
                await self._finalize(held, "unknown", reason=expired)
                return "unknown"
            if isinstance(found, base.NotFound) and contract.may_resend and not capped:
                return await self._requeue(held, connector_name, "lookup found no effect; "
                                           "resend the same request with the same key")
            if capped:
                return await self._cap(held, connector_name, found.reason)
            await self._finalize(held, "unknown", reason=f"{found.reason}; {fenced}")
            return "unknown"
        if contract.may_resend and not expired and not capped:
            return await self._requeue(held, connector_name, "lease expired; the contract "
                                       "allows resending the same request")
        if expired:
            await self._finalize(held, "unknown", reason=expired)
            return "unknown"
        if capped:
            return await self._cap(held, connector_name, "lease expired without an answer")
        await self._finalize(held, "unknown", reason="lease expired without a recorded answer; "
                             "the provider cannot be asked: an operator must reconcile; "
                             + fenced)
        return "unknown"

    async def _fence(self, connector: base.Connector, held: dispatch.Claim,
                     call: base.Call) -> str:
        """Advance the provider's fence to the take-over's generation (fencing connectors),
        audited; returns what that means for a late call, for the recorded reason."""
        if not boundary.can_fence(connector):
            return ("the provider cannot be fenced: a stalled earlier call may still land "
                    "(it carried its deadline)")
        token = self.credentials.token(connector.name, held.tenant_id)
        answer: base.FenceResult
        if token is None:
            answer = base.NotSent("no lookup credential for this tenant")
        else:
            with spans.span(tracer, "fence", kind=SpanKind.CLIENT, attributes={
                    spans.CONNECTOR: connector.name, spans.GENERATION: held.generation}):
                answer = await boundary.fence(
                    connector, replace(call, fencing_generation=held.generation), token,
                    bound_s=connector.contract.call_timeout_s)
        advanced = isinstance(answer, base.Advanced)
        async with self.pool.acquire() as conn:
            await dispatch.record_fence(conn, held, advanced=advanced, detail=(
                "advanced" if advanced else getattr(answer, "reason", "not advanced")),
                traceparent=spans.traceparent_of())
        if advanced:
            return (f"the provider's fence was advanced to generation {held.generation}: an "
                    "earlier call can no longer apply")
        why = common.reason_text(getattr(answer, "reason", "no answer"))[:200]
        log.warning("event=fence_not_advanced operation_id=%s generation=%d reason=%s",
                    held.operation_id, held.generation, why)
        return (f"the provider's fence could not be advanced ({why}): a stalled earlier call "
                "may still land")

    async def _cap(self, held: dispatch.Claim, connector_name: str, last: str) -> Action:
        """A take-over at the generation cap: held as ``unknown`` for an operator (R7.5)."""
        await self._finalize(held, "unknown", reason=common.reason_text(
            f"retry cap: {held.generation} dispatch generations without a definitive "
            f"answer (last: {last[:200]}); held for an operator"))
        telemetry_metrics.retries_capped.add(
            1, connector=telemetry_metrics.bounded(connector_name))
        log.warning("event=retry_capped operation_id=%s generation=%d", held.operation_id,
                    held.generation)
        return "unknown"

    async def _requeue(self, held: dispatch.Claim, connector_name: str, reason: str) -> Action:
        async with self.pool.acquire() as conn:
            requeued = await dispatch.requeue(conn, held, reason=reason,
                                              traceparent=spans.traceparent_of(),
                                              max_generations=self.max_generations)
        if requeued == "capped":
            telemetry_metrics.retries_capped.add(
                1, connector=telemetry_metrics.bounded(connector_name))
            log.warning("event=retry_capped operation_id=%s generation=%d", held.operation_id,
                        held.generation)
            return "unknown"
        return "requeued"

    async def _finalize(self, held: dispatch.Claim, state: dispatch.FinalState, *,
                        receipt: str | None = None, reason: str | None = None) -> None:
        async with self.pool.acquire() as conn:
            await dispatch.finalize(conn, held, state, receipt=receipt, reason=reason,
                                    traceparent=spans.traceparent_of())
        log.info("event=reconciled operation_id=%s state=%s", held.operation_id, state)
