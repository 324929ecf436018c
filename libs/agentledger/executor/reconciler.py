"""Recovery by contract (R5.5, R6.4): expired leases and unknown outcomes.

An expired lease does not prove the worker stopped. The reconciler takes the command over
(a new claim token and fencing generation: the old holder can no longer finalize) and then
follows the connector's declared contract:

- ``keyed`` with lookup: ask the provider by key. Found → ``succeeded`` with its receipt. Not
  found → requeue: the executor sends the identical request with the same key (a late
  original is deduped by the provider). No answer → ``unknown``, looked up again next sweep.
- ``keyed`` without lookup, ``replay_safe``: requeue (resending the same key is safe).
- ``none``: ``unknown``; only an operator can resolve it. Nothing is ever resent.

And one more case, for a loss it cannot otherwise see: a command still ``pending`` long
after admission whose outbox row is gone was published and never claimed — its Kafka
record was lost after the broker acknowledged it, or no executor consumes its topic. Its
obligation is republished (nothing was ever sent for it, and executors claim a command
once).

It never calls a write API and never the planner (R6.5): its credential is lookup-only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agentledger import errors, faults
from agentledger.approvals import repository as approvals
from agentledger.connectors import base
from agentledger.ledger import dispatch, repository
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentledger.reconciler")

# A lookup is one read; the lease only needs to cover it and the bookkeeping.
LEASE_S = 30.0

Action = Literal["succeeded", "requeued", "unknown", "skipped", "republished", "retried"]
# Far longer than relay lag plus executor backlog in normal operation: a renewal is a
# diagnosis (a record was lost), not a retry loop.
STRANDED_AFTER_S = 300.0


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
        await self._republish_stranded(done, limit)
        await self.count_unknown()
        return done

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
                with spans.span(tracer, "republish", context=spans.ROOT, attributes={
                        spans.OPERATION_ID: str(item["operation_id"]),
                        spans.CONNECTOR: item["connector"]}):
                    retry = item["retry_at"] is not None
                    renewed = await dispatch.republish(
                        conn, item["tenant_id"], item["operation_id"],
                        older_than_s=self.stranded_after_s, traceparent=spans.traceparent_of(),
                        retry_due=retry)
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
            if dispatch.may_still_act(before, current["lease_until"], contract.call_timeout_s):
                # A stalled holder may still send: take nothing over and declare nothing
                # until its call bound has run out past the lease (next passes).
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
        if contract.lookup:
            token = self.credentials.token(connector.name, tenant_id)
            found: base.Applied | base.NotFound | base.InDoubt
            if token is None:
                found = base.InDoubt("no lookup credential for this tenant")
            else:
                await faults.point("reconciler.mid_lookup")
                with spans.span(tracer, "lookup", kind=SpanKind.CLIENT, attributes={
                        spans.CONNECTOR: connector.name, spans.GENERATION: held.generation}):
                    found = await connector.lookup(call, token)
            if isinstance(found, base.Applied):
                await self._finalize(held, "succeeded", receipt=found.receipt)
                return "succeeded"
            if isinstance(found, base.NotFound) and contract.may_resend and expired:
                # The provider forgot the key (or will before a resend lands): "not found"
                # no longer means "not done", and a resend would be a second effect.
                await self._finalize(held, "unknown", reason=expired)
                return "unknown"
            if isinstance(found, base.NotFound) and contract.may_resend:
                return await self._requeue(held, connector_name, "lookup found no effect; "
                                           "resend the same request with the same key")
            await self._finalize(held, "unknown", reason=getattr(found, "reason", "no answer"))
            return "unknown"
        if contract.may_resend and not expired:
            return await self._requeue(held, connector_name, "lease expired; the contract "
                                       "allows resending the same request")
        if expired:
            await self._finalize(held, "unknown", reason=expired)
            return "unknown"
        await self._finalize(held, "unknown", reason="lease expired without a recorded answer; "
                             "the provider cannot be asked: an operator must reconcile")
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
