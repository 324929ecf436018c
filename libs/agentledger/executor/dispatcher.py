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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from uuid import UUID

import asyncpg

from agentledger import errors, faults
from agentledger.connectors import base
from agentledger.ledger import dispatch, keys, repository
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import decision as decision_mod
from agentledger.policy import repository as policy_repo

log = logging.getLogger(__name__)

# The lease must outlast one call with its resends (connector read timeout 5 s, up to three
# sends, backoff); 60 s leaves room for a slow database on top without letting a dead
# worker's command wait long for the reconciler.
LEASE_S = 60.0
# Identical resends with the same key after an answer was lost (keyed / replay-safe only).
RESENDS = 2
# A refused connection proves nothing was sent; retry it this often before handing back.
NOT_SENT_RETRIES = 3

Disposition = Literal["claimed", "terminal", "held", "missing"]
TERMINAL = frozenset({"succeeded", "denied", "expired", "review_required", "failed"})


@dataclass(frozen=True)
class Begun:
    """What ``begin`` found: a claim to complete, or why there is nothing to do."""

    disposition: Disposition
    claim: dispatch.Claim | None = None
    state: str | None = None


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

    async def begin(
        self, tenant_id: UUID, operation_id: UUID, *, traceparent: str | None = None
    ) -> Begun:
        """Claim the command if it is pending. Never calls anything remote."""
        async with self.pool.acquire() as conn:
            try:
                row = await repository.load_command(conn, tenant_id, operation_id)
            except errors.CommandNotFound:
                return Begun("missing")
            if row["state"] in TERMINAL:
                # Redelivery of a finished command: its recorded result stands (R5.7).
                return Begun("terminal", state=row["state"])
            held = await dispatch.claim(
                conn, tenant_id, operation_id, worker_id=self.worker_id, lease_s=self.lease_s,
                traceparent=traceparent,
            )
        if held is None:
            return Begun("held", state=row["state"])
        await faults.point("executor.after_claim")
        return Begun("claimed", claim=held)

    async def complete(self, held: dispatch.Claim, *, traceparent: str | None = None) -> str:
        """Check, call and record. Returns the state recorded; raises StaleClaim if fenced."""
        async with self.pool.acquire() as conn:
            row = await repository.load_command(conn, held.tenant_id, held.operation_id)
            refusal = await self._refusal(conn, row)
            if refusal is not None:
                state, reason = refusal
                await self._finalize(conn, held, state, reason=reason, traceparent=traceparent)
                return state
            arguments = json.loads(await self.cipher.decrypt(
                conn, held.tenant_id, held.operation_id, bytes(row["payload_ciphertext"]),
                row["payload_key_version"],
            ))
        connector = self.connectors[row["connector"]]
        token = self.credentials.token(connector.name, held.tenant_id)
        async with self.pool.acquire() as conn:
            if token is None:
                await self._finalize(conn, held, "denied", traceparent=traceparent,
                                     reason="no write credential for this tenant")
                return "denied"
        call = base.Call(held.tenant_id, held.operation_id, row["action"], row["resource_id"],
                         arguments, row["expected_revision"])
        result, held = await self._call(connector, call, token, held, traceparent)
        return await self.record(held, result, traceparent=traceparent)

    async def _refusal(
        self, conn: repository.Conn, row: asyncpg.Record
    ) -> tuple[dispatch.FinalState, str] | None:
        """R2.6: the decision must still be valid and the CURRENT policy must still permit."""
        if row["expires_at"] <= datetime.now(UTC):
            return "expired", "the approval expired before dispatch"
        if row["payload_ciphertext"] is None:
            return "expired", "the payload was purged before dispatch"
        try:
            spec = self.allowlist.get(row["action"])
        except errors.UnknownAction:
            return "denied", f"{row['action']} is no longer on the allowlist"
        verdict = await self.authorizer.authorize(
            conn, tenant_id=row["tenant_id"], principal_id=row["principal_id"], action=spec,
            resource_id=row["resource_id"])
        async with repository.transaction(conn, row["tenant_id"]) as tx:
            await policy_repo.record_decision(
                tx, verdict, tenant_id=row["tenant_id"], principal_id=row["principal_id"],
                action=spec.name, resource_id=row["resource_id"],
                operation_id=row["operation_id"], stage="dispatch")
        # Only a denial stops a command: one a person approved stays approved (R2.6).
        if verdict.effect == "deny":
            return "denied", f"current policy denies it: {verdict.reason}"[:500]
        return None

    async def _call(
        self, connector: base.Connector, call: base.Call, token: str, held: dispatch.Claim,
        traceparent: str | None,
    ) -> tuple[base.Result, dispatch.Claim]:
        result = await connector.execute(call, token)
        await faults.point("executor.after_remote_write")
        tries = 0
        while isinstance(result, base.NotSent) and tries < NOT_SENT_RETRIES:
            tries += 1
            await asyncio.sleep(0.2 * 2**tries)  # backoff before reconnecting, not a wait-for
            result = await connector.execute(call, token)
        resends = 0
        may_resend = connector.contract.may_resend
        while isinstance(result, base.InDoubt) and may_resend and resends < RESENDS:
            # The same request with the same key: the provider dedupes (R6.4), never a new key.
            resends += 1
            async with self.pool.acquire() as conn:
                await dispatch.finish_attempt(conn, held, "unknown", result.reason)
                held = await dispatch.new_attempt(conn, held, kind="resend",
                                                  traceparent=traceparent)
            result = await connector.execute(call, token)
        return result, held

    async def record(
        self, held: dispatch.Claim, result: base.Result | base.NotFound, *,
        traceparent: str | None = None,
    ) -> str:
        """Record a call's result as the command's state, conditional on the claim."""
        async with self.pool.acquire() as conn:
            if isinstance(result, base.Applied):
                await self._finalize(conn, held, "succeeded", receipt=result.receipt,
                                     traceparent=traceparent)
                state = "succeeded"
            elif isinstance(result, base.PreconditionFailed):
                # R2.7: back to review; never retried without the condition.
                await self._finalize(conn, held, "review_required", reason=result.reason,
                                     traceparent=traceparent)
                state = "review_required"
            elif isinstance(result, base.Refused):
                await self._finalize(conn, held, "denied", reason=result.reason,
                                     traceparent=traceparent)
                state = "denied"
            elif isinstance(result, base.NotSent):
                await dispatch.requeue(conn, held, reason=result.reason, traceparent=traceparent)
                state = "pending"
            else:
                # No definitive answer: unknown, never an invented success (R6.1, R6.4).
                await self._finalize(conn, held, "unknown", reason=result.reason,
                                     traceparent=traceparent)
                state = "unknown"
        await faults.point("executor.after_receipt")
        log.info("event=dispatched operation_id=%s state=%s generation=%s",
                 held.operation_id, state, held.generation)
        return state

    async def _finalize(
        self, conn: repository.Conn, held: dispatch.Claim, state: dispatch.FinalState, *,
        receipt: str | None = None, reason: str | None = None, traceparent: str | None,
    ) -> None:
        await dispatch.finalize(conn, held, state, receipt=receipt, reason=reason,
                                traceparent=traceparent)
