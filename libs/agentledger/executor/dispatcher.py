"""One command's dispatch, from claim to recorded outcome.

``begin`` claims the command durably (a short transaction; no lock survives it) and returns
the claim; ``complete`` does the checks and the call and records the outcome conditionally
on the claim. The executor service acks the Kafka record once ``begin`` returned: from then
on the command is durably claimed, and if this process dies its lease expires and the
reconciler recovers it by the connector's contract (R5.5, R5.7).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, TypeVar
from uuid import UUID

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from agentledger import errors, faults
from agentledger.connectors import base, boundary
from agentledger.contracts import commands
from agentledger.executor import checks, late_answers
from agentledger.ledger import coalesce, dispatch, groupcommit, keys, repository, steps
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import decision as decision_mod
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentledger.executor")
T = TypeVar("T")

# The lease covers the checks before the first call; each call then renews it to cover that
# call (``dispatch.mark_sending``). 60 s leaves room for a slow database and policy check
# without letting a dead worker's command wait long for the reconciler.
LEASE_S = 60.0
# Identical resends with the same key after an answer was lost (keyed / replay-safe only).
RESENDS = 2
# A refused connection proves nothing was sent; retry it this often before handing back.
NOT_SENT_RETRIES = 3
# A write of a claim we hold (the pre-call mark, the outcome) that fails on the database (a
# restart, a failover, a blip) is tried again (issue 41 §6): the command finishes seconds
# after the database is back instead of waiting for its lease and the reconciler. First retry
# after 0.2 s, doubling to at most 1 s (the pause is what a command waits after the heal).
# The pre-call mark is never tried past the claim's lease less RETRY_MARGIN_S: no call is
# made on a lease that may have run out (R5.5). An outcome the provider already gave is tried
# for OUTCOME_RETRY_S whatever the lease: its statement is conditioned on the claim's token
# (steps.sql `finalize`), which every take-over replaces, so a worker whose claim was taken is
# refused (StaleClaim) however late it retries; past the bound it is logged as unrecorded and
# the lease and the reconciler recover the command as before.
RETRY_FIRST_S, RETRY_MAX_S, RETRY_MARGIN_S = 0.2, 1.0, 1.0
OUTCOME_RETRY_S = 60.0

Disposition = Literal["claimed", "terminal", "held", "missing", "foreign"]
# Bounded names of what a call returned (span attribute and metric label).
_RESULTS = late_answers.RESULTS


@dataclass(frozen=True)
class Begun:
    """What ``begin`` found: a claim to complete, or why there is nothing to do."""

    disposition: Disposition
    claim: dispatch.Claim | None = None
    state: str | None = None
    row: asyncpg.Record | None = None  # the command as loaded before the claim
    # The dispatch-time checks made in the claim's transaction (``_refusal``'s answer).
    checked: checks.Checked | None = None


class _Prepared(NamedTuple):
    """What a call needs, read before it (``Dispatcher._prepare``)."""

    row: asyncpg.Record
    checked: checks.Checked
    connector: base.Connector
    token: str
    arguments: Any


@dataclass
class Dispatcher:
    """Dispatches commands of any connector it holds."""

    pool: asyncpg.Pool
    connectors: Mapping[str, base.Connector]
    credentials: base.Credentials
    cipher: keys.PayloadCipher
    authorizer: decision_mod.Authorizer
    allowlist: allowlist_mod.Allowlist
    worker_id: str
    lease_s: float = LEASE_S
    max_generations: int = dispatch.MAX_GENERATIONS
    # Overrides every connector's declared call bound (``Contract.call_timeout_s``), e.g. a
    # short one under the chaos tier's short leases.
    call_timeout_s: float | None = None
    # Claims, pre-call marks and finalizes that overlap share a transaction (one COMMIT).
    # None: one over ``pool`` with the default bounds.
    group: groupcommit.GroupCommit | None = None
    _group: groupcommit.GroupCommit = field(init=False, repr=False)
    # The dispatch span opened by ``begin`` for a claim (by attempt id), closed by ``complete``.
    _spans: dict[UUID, Span] = field(default_factory=dict, init=False, repr=False)
    # The command row ``begin`` loaded for a claim (by attempt id), for ``complete``: every
    # field it reads is frozen at admission, so it is not loaded twice.
    _rows: dict[UUID, tuple[asyncpg.Record, checks.Checked | None]] = field(
        default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._group = self.group or groupcommit.GroupCommit(self.pool)
        # The claims, pre-call marks and outcomes of concurrent calls of one tenant, each
        # step one set-based statement for all of them (issue 41, ledger.steps).
        self._claims = coalesce.Coalescer(self._group, self._claim_rows, key=steps.command_of)
        self._marks = coalesce.Coalescer(self._group, _mark_rows, key=steps.command_of)
        self._finals = coalesce.Coalescer(self._group, _final_rows, key=steps.command_of)
        for connector in self.connectors.values():
            if not 0 < self.call_bound(connector) <= dispatch.MAX_CALL_S:
                # Past it, an operator's resolution could land while the call still runs.
                raise ValueError(f"the call bound of {connector.name} must be in "
                                 f"(0, {dispatch.MAX_CALL_S:g}] s (ledger.dispatch.MAX_CALL_S)")

    def call_bound(self, connector: base.Connector) -> float:
        """The longest one call to ``connector`` may take before it counts as in doubt."""
        return self.call_timeout_s or connector.contract.call_timeout_s

    async def begin(
        self, tenant_id: UUID, operation_id: UUID, *, traceparent: str | None = None
    ) -> Begun:
        """Claim the command if it is pending. Never calls anything remote.

        Opens the ``dispatch`` span (a child of the record's context; linked to the approval
        request when the trace resumes one); ``complete`` ends it. Its context is what the
        claim records on the attempt row, so a later reconciliation links to it.
        """
        resumed = spans.resumed_link()
        span = tracer.start_span(
            "dispatch", context=spans.parent(traceparent), links=[resumed] if resumed else None,
            attributes={spans.OPERATION_ID: str(operation_id)})
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            try:
                begun = await self._begin(tenant_id, operation_id,
                                          spans.traceparent_of(span) or traceparent)
            except BaseException as exc:
                spans.failed(span, exc)
                span.end()
                raise
        if begun.claim is None:
            span.set_attribute("agentledger.disposition", begun.disposition)
            if begun.state is not None:
                span.set_attribute(spans.STATE, begun.state)
            span.end()
        else:
            span.set_attribute(spans.GENERATION, begun.claim.generation)
            self._spans[begun.claim.attempt_id] = span
            if begun.row is not None:
                self._rows[begun.claim.attempt_id] = (begun.row, begun.checked)
        return begun

    async def _begin(
        self, tenant_id: UUID, operation_id: UUID, traceparent: str | None
    ) -> Begun:
        # One statement claims a pending command of ours and returns it with its principal,
        # for every claim the calls of this moment ask for together (issue 41); only when
        # it claims nothing is the command loaded, to say why. The dispatch-time checks (R2.6:
        # the current policy asked about the principal as recorded now) need nothing more;
        # the decision's write goes with the pre-call mark or the refusal's finalize.
        claimed = await self._claims.submit(tenant_id, steps.ClaimRow(operation_id,
                                                                      traceparent))
        if claimed is None:
            async with self.pool.acquire() as conn, \
                    repository.transaction(conn, tenant_id) as tx:
                return await self._not_claimed(tx, tenant_id, operation_id)
        held, row = claimed
        checked = await self._refusal(None, row, principal=checks.principal_of(row))
        await faults.point("executor.after_claim")
        return Begun("claimed", claim=held, row=row, checked=checked)

    async def _claim_rows(self, conn: repository.Conn, tenant_id: UUID,
                          rows: Sequence[steps.ClaimRow]
                          ) -> list[tuple[dispatch.Claim, asyncpg.Record] | None]:
        async with repository.transaction(conn, tenant_id) as tx:
            claimed = await steps.claim(tx, tenant_id, rows, worker_id=self.worker_id,
                                        lease_s=self.lease_s, connectors=list(self.connectors))
            await coalesce.before_commit(rows)
            return claimed

    async def _not_claimed(self, tx: repository.Conn, tenant_id: UUID,
                           operation_id: UUID) -> Begun:
        """Why the claim took nothing: no such command, a finished one (its recorded result
        stands, R5.7), one of another connector (its own executor gets its own record), or
        one another worker holds."""
        row = await repository.load_command_in(tx, tenant_id, operation_id)
        if row is None:
            return Begun("missing")
        if row["state"] in commands.TERMINAL_STATES:
            return Begun("terminal", state=row["state"])
        if row["connector"] not in self.connectors:
            return Begun("foreign", state=row["state"])
        return Begun("held", state=row["state"])

    async def complete(self, held: dispatch.Claim, *, traceparent: str | None = None) -> str:
        """Check, call and record. Returns the state recorded; raises StaleClaim if fenced."""
        row, checked = self._rows.pop(held.attempt_id, (None, None))
        span = self._spans.pop(held.attempt_id, None) or tracer.start_span(
            "dispatch", context=spans.parent(traceparent), attributes={
                spans.OPERATION_ID: str(held.operation_id), spans.GENERATION: held.generation})
        seen: dict[str, str] = {}
        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):
            try:
                state = await self._complete(held, spans.traceparent_of(span) or traceparent,
                                             seen, row, checked)
            except BaseException as exc:
                spans.failed(span, exc)
                raise
            span.set_attribute(spans.STATE, state)
        telemetry_metrics.dispatch_outcomes.add(
            1, state=state, connector=telemetry_metrics.bounded(seen.get("connector")))
        return state

    async def _complete(
        self, held: dispatch.Claim, traceparent: str | None, seen: dict[str, str],
        row: asyncpg.Record | None, checked: checks.Checked | None,
    ) -> str:
        # Before any call: across a database blip only while the lease covers it (R5.5).
        prepared = await self._while_held(
            held, "prepare", lambda: self._prepare(held, traceparent, seen, row, checked),
            until=held.lease_until - timedelta(seconds=RETRY_MARGIN_S))
        if isinstance(prepared, str):
            return prepared
        row, checked, connector, token, arguments = prepared
        call = base.Call(held.tenant_id, held.operation_id, row["action"], row["resource_id"],
                         arguments, row["expected_revision"], fencing_generation=held.generation)
        result, held, stale = await self._call(connector, call, token, held, traceparent,
                                               checked.decision())
        if stale:
            log.warning("event=taken_over_between_calls operation_id=%s generation=%d",
                        held.operation_id, held.generation)
            await self._record_late(held, result, row["connector"], traceparent)
            raise errors.StaleClaim("the claim was taken over before the next call; the last "
                                    "answer is recorded on its attempt",
                                    operation_id=str(held.operation_id),
                                    generation=held.generation)
        if isinstance(result, base.Fenced):
            # A newer claim (or a take-over's fence) is ahead of ours at the provider: nothing
            # applied, and the outcome is not ours to record; the refusal goes on our attempt.
            log.warning("event=fenced_by_provider operation_id=%s generation=%d",
                        held.operation_id, held.generation)
            await self._record_late(held, result, row["connector"], traceparent)
            raise errors.StaleClaim("the provider refused this claim's fencing token; no "
                                    "outcome is recorded", operation_id=str(held.operation_id),
                                    generation=held.generation)
        try:
            return await self.record(held, result, connector=row["connector"],
                                     traceparent=traceparent)
        except errors.StaleClaim:
            # Fenced out after the call: what the provider said is still a fact about our
            # attempt, and may settle or contradict what the ledger says now (issue 37 §3).
            await self._record_late(held, result, row["connector"], traceparent)
            raise

    async def _prepare(
        self, held: dispatch.Claim, traceparent: str | None, seen: dict[str, str],
        row: asyncpg.Record | None, checked: checks.Checked | None,
    ) -> str | _Prepared:
        """What the call needs (the command, the checks, the connector, its credential, the
        decrypted arguments), or the state recorded instead of calling (a refusal)."""
        async with self.pool.acquire() as conn:
            if row is None:
                row = await repository.load_command(conn, held.tenant_id, held.operation_id)
            seen["connector"] = row["connector"]
            spans.annotate(action=row["action"], connector=row["connector"])
            checked = checked or await self._refusal(conn, row)
            if checked.refusal is not None:
                state, reason = checked.refusal
                await self._finalize(conn, held, state, reason=reason, traceparent=traceparent,
                                     also=checked.also())
                return state
            arguments = json.loads(await self.cipher.decrypt(
                conn, held.tenant_id, held.operation_id, bytes(row["payload_ciphertext"]),
                row["payload_key_version"],
            ))
            connector = self.connectors[row["connector"]]
            token = self.credentials.token(connector.name, held.tenant_id)
            if token is None:
                await self._finalize(conn, held, "denied", traceparent=traceparent,
                                     reason="no write credential for this tenant",
                                     also=checked.also())
                return "denied"
        return _Prepared(row, checked, connector, token, arguments)

    async def _record_late(self, held: dispatch.Claim, result: base.Result, connector: str,
                           traceparent: str | None) -> None:
        await late_answers.record(self.pool, held, result, connector, traceparent)

    async def _refusal(
        self, conn: repository.Conn | None, row: asyncpg.Record, *,
        principal: cedar.Principal | checks.Unread | None = checks.UNREAD,
    ) -> checks.Checked:
        return await checks.refusal(self.pool, self.allowlist, self.authorizer, conn, row,
                                    principal=principal)

    async def _call(
        self, connector: base.Connector, call: base.Call, token: str, held: dispatch.Claim,
        traceparent: str | None, decided: dispatch.DispatchDecision | None = None,
    ) -> tuple[base.Result, dispatch.Claim, bool]:
        """The call, its reconnects and keyed resends. Returns the last result, the claim it
        was made under, and whether the claim was taken over before a further call (the
        result is then a late answer: recorded, never an outcome)."""
        result, first = await self._attempt(connector, call, token, held, "dispatch", None,
                                            decision=decided)
        await faults.point("executor.after_remote_write")
        try:
            tries = 0
            while isinstance(result, base.NotSent) and tries < NOT_SENT_RETRIES:
                tries += 1
                await asyncio.sleep(0.2 * 2**tries)  # backoff before reconnecting, not a wait-for
                result, _ = await self._attempt(connector, call, token, held, "reconnect", first)
            resends = 0
            may_resend = connector.contract.may_resend
            while isinstance(result, base.InDoubt) and may_resend and resends < RESENDS:
                # The same request with the same key: the provider dedupes (R6.4), never a
                # new key.
                resends += 1
                try:
                    # Writes before a call: across a blip only while the lease covers it.
                    held = await self._while_held(
                        held, "resend", _resend_attempt(self.pool, held, result, traceparent),
                        until=held.lease_until - timedelta(seconds=RETRY_MARGIN_S))
                except errors.StorageError as exc:
                    if not exc.retryable:
                        raise
                    # The ledger stayed away past the lease: no resend; the answer in hand
                    # (in doubt) is recorded as `unknown`, token-fenced, for the reconciler's
                    # lookup, instead of the command waiting for its lease (issue 41 §6).
                    log.warning("event=resend_skipped operation_id=%s error=%s",
                                held.operation_id, exc.code)
                    break
                result, _ = await self._attempt(connector, call, token, held, "resend", first)
        except errors.StaleClaim:
            # Taken over between two calls (the pre-call check refused the next one): the
            # answer already in hand is still what the provider said.
            return result, held, True
        return result, held, False

    async def _attempt(
        self, connector: base.Connector, call: base.Call, token: str, held: dispatch.Claim,
        kind: str, first: Link | None, *, decision: dispatch.DispatchDecision | None = None,
    ) -> tuple[base.Result, Link]:
        """One connector call in its own ``attempt`` span; a reconnect or a resend links to
        the first attempt. Returns the result and the link to the first attempt.

        The call is bounded (``call_bound``): past it the answer is ``InDoubt`` — the request
        may have reached the provider — never a success. The pre-call check renewed the
        lease to cover that bound, so a worker that is not stalled never calls on a claim the
        reconciler could take over mid-call.

        Raises:
            StaleClaim: The claim is no longer current: the call is not made.
        """
        bound = self.call_bound(connector)
        # Immediately before the call, on the ledger and not from memory: a worker that
        # stalled past its lease (a GC pause, a frozen VM) must not act on a claim that was
        # taken from it; and an unmarked claim is known never to have sent (issue 17).
        lease_until = await self._while_held(
            held, "mark", lambda: self._marks.submit(
                held.tenant_id, steps.MarkRow(held, bound + dispatch.CALL_MARGIN_S, decision)),
            until=held.lease_until - timedelta(seconds=RETRY_MARGIN_S))
        if lease_until is None:
            raise errors.StaleClaim("the claim is no longer current; the call was not made",
                                    operation_id=str(held.operation_id))
        # The call's deadline, sent with it: a provider that honours it refuses the request
        # if it arrives after this call's own timer has given up on it (issue 37 §2).
        call = replace(call, deadline=datetime.now(UTC) + timedelta(seconds=bound))
        # A stall here (a GC pause, SIGSTOP) outlives the renewed lease: only the provider's
        # fencing (or its deadline) can refuse the call that follows.
        await faults.point("executor.before_call")
        with spans.span(tracer, "attempt", kind=SpanKind.CLIENT, links=[first], attributes={
                spans.OPERATION_ID: str(call.operation_id), spans.ACTION: call.action,
                spans.CONNECTOR: connector.name, spans.GENERATION: held.generation,
                spans.ATTEMPT_KIND: kind, spans.ATTEMPT_ID: str(held.attempt_id)}) as span:
            started = time.perf_counter()
            # Bounded and classified: whatever the provider or the connector does, one of
            # the closed set of results, every text storable (R14).
            result = await boundary.execute(connector, call, token, bound_s=bound)
            outcome = _RESULTS.get(type(result), "other")
            span.set_attribute(spans.OUTCOME, outcome)
        telemetry_metrics.attempt_duration.record(
            time.perf_counter() - started, connector=telemetry_metrics.bounded(connector.name),
            outcome=outcome)
        return result, first or Link(span.get_span_context(), {spans.LINK_REASON: "first_attempt"})

    async def record(
        self, held: dispatch.Claim, result: base.Result | base.NotFound, *, connector: str,
        traceparent: str | None = None,
    ) -> str:
        """Record a call's result as the command's state, conditional on the claim.
        Finalizes that overlap share a transaction (group commit). ``connector`` (the
        command's) labels what is counted."""
        final: tuple[dispatch.FinalState, str | None, str | None] | None = None
        if isinstance(result, base.Applied):
            final = ("succeeded", result.receipt, None)
        elif isinstance(result, base.PreconditionFailed):
            final = ("review_required", None, result.reason)  # R2.7: back to review
        elif isinstance(result, base.Refused):
            final = ("denied", None, result.reason)
        elif not isinstance(result, base.NotSent):
            # No definitive answer: unknown, never an invented success (R6.1, R6.4).
            final = ("unknown", None, result.reason)
        state: str
        if final is not None:
            final_state, receipt, reason = final
            row = dispatch.final_row(held, final_state, receipt=receipt, reason=reason,
                                     traceparent=traceparent)
            tries = 0

            def finalize() -> Awaitable[bool]:
                nonlocal tries
                tries += 1
                return self._finals.submit(held.tenant_id, row)

            # Token-fenced, not lease-bound: see OUTCOME_RETRY_S.
            recorded = await self._while_held(
                held, "finalize", finalize,
                until=datetime.now(UTC) + timedelta(seconds=OUTCOME_RETRY_S))
            if not recorded and not (tries > 1 and await self._recorded_before(row)):
                raise dispatch.stale_outcome(held)
            state = final_state
        else:
            assert isinstance(result, base.NotSent)
            async with self.pool.acquire() as conn:
                # Nothing was sent: the provider is down or unreachable. Back off (with
                # jitter) before the next generation instead of meeting the same outage
                # at once; the reconciler publishes it when due (issue 18 §4).
                requeued = await dispatch.requeue(conn, held, reason=result.reason,
                                                  traceparent=traceparent,
                                                  max_generations=self.max_generations,
                                                  delay_s=dispatch.backoff(held.generation))
                state = "pending" if requeued == "requeued" else "unknown"
                if requeued == "capped":
                    telemetry_metrics.retries_capped.add(
                        1, connector=telemetry_metrics.bounded(connector))
                    log.warning("event=retry_capped operation_id=%s generation=%d",
                                held.operation_id, held.generation)
        await faults.point("executor.after_receipt")
        log.info("event=dispatched operation_id=%s state=%s generation=%s",
                 held.operation_id, state, held.generation)
        return state

    async def _while_held(self, held: dispatch.Claim, what: str,
                          write: Callable[[], Awaitable[T]], *, until: datetime) -> T:
        """``write`` (a write conditional on ``held``), tried again after a retryable
        database failure until ``until`` (``RETRY_*``, ``OUTCOME_RETRY_S``). A connection
        refused or reset while the pool reconnects (the server restarting: no
        ``StorageError`` yet) counts as one.

        Raises:
            StaleClaim: the claim was taken over (never retried).
            StorageError: still failing at ``until``, or not retryable.
        """
        pause = RETRY_FIRST_S
        while True:
            try:
                return await write()
            except errors.StaleClaim:
                raise
            except Exception as exc:
                failed = (exc if isinstance(exc, errors.StorageError)
                          else repository.driver_error(exc))
                if failed is None:
                    raise
                left = (until - datetime.now(UTC)).total_seconds()
                if not failed.retryable or left <= pause:
                    if what == "finalize":
                        log.error("event=outcome_unrecorded operation_id=%s generation=%d "
                                  "error=%s: the lease and the reconciler recover it",
                                  held.operation_id, held.generation, failed.code)
                    if failed is exc:
                        raise
                    raise failed from exc
                log.warning("event=write_retried what=%s operation_id=%s error=%s in_s=%.1f",
                            what, held.operation_id, failed.code, pause)
                await asyncio.sleep(pause)  # backoff across an outage, bounded by `until`
                pause = min(pause * 2, RETRY_MAX_S)

    async def _recorded_before(self, row: steps.FinalRow) -> bool:
        """Whether an earlier try of ``row`` committed although its answer was lost (the
        connection died under its COMMIT), so the retry found the claim already released: the
        claim's own attempt is closed with this outcome's result, which only this finalize
        writes (a take-over closes only attempts never sent, as ``abandoned``)."""
        held = row.held
        try:
            async with self.pool.acquire() as conn:
                tried = await dispatch.attempts(conn, held.tenant_id, held.operation_id)
                current = await repository.load_command(conn, held.tenant_id,
                                                        held.operation_id)
        except Exception as exc:
            if repository.driver_error(exc) is None and not isinstance(exc,
                                                                       errors.StorageError):
                raise
            return False  # not provable now: counted as taken over, its answer recorded late
        mine = next((a for a in tried if a["attempt_id"] == held.attempt_id), None)
        return (mine is not None and mine["finished_at"] is not None
                and mine["result"] == row.attempt_result and current["state"] == row.state)

    async def _finalize(
        self, conn: repository.Conn, held: dispatch.Claim, state: dispatch.FinalState, *,
        receipt: str | None = None, reason: str | None = None, traceparent: str | None,
        also: dispatch.Also | None = None,
    ) -> None:
        await dispatch.finalize(conn, held, state, receipt=receipt, reason=reason,
                                traceparent=traceparent, also=also)


async def _mark_rows(conn: repository.Conn, tenant_id: UUID,
                     rows: Sequence[steps.MarkRow]) -> list[datetime | None]:
    async with repository.transaction(conn, tenant_id) as tx:
        marked = await steps.mark(tx, tenant_id, rows)
        await coalesce.before_commit(rows)
        return marked


async def _final_rows(conn: repository.Conn, tenant_id: UUID,
                      rows: Sequence[steps.FinalRow]) -> list[bool]:
    async with repository.transaction(conn, tenant_id) as tx:
        recorded = await steps.finalize(tx, tenant_id, rows)
        await coalesce.before_commit(rows)
        return recorded


def _resend_attempt(pool: asyncpg.Pool, held: dispatch.Claim, result: base.InDoubt,
                    traceparent: str | None) -> Callable[[], Awaitable[dispatch.Claim]]:
    """The writes before a resend: the attempt in doubt closed ``unknown``, a new attempt
    under the same claim. Safe to run again after a blip: the close rewrites the same row,
    and an insert that committed unseen leaves an attempt never marked as sent, which no
    recovery counts as one that may have acted."""
    async def write() -> dispatch.Claim:
        async with pool.acquire() as conn:
            await dispatch.finish_attempt(conn, held, "unknown", result.reason)
            return await dispatch.new_attempt(conn, held, kind="resend",
                                              traceparent=traceparent)
    return write
