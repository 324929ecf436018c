"""The dispatch-time checks (R2.6): is the command still to be sent, and does the CURRENT
policy still permit it? Asked right after the claim, with nothing read but the claim's row.

A command is refused before any call when it is a shadow run's (R9.2), its authorization
expired, its payload was purged, its action left the allowlist, or the policy now denies its
principal (only a denial stops a command: one a person approved stays approved).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from opentelemetry import trace

from agentledger import errors
from agentledger.contracts import common
from agentledger.ledger import dispatch, repository
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import decision as decision_mod
from agentledger.policy import repository as policy_repo
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

tracer = trace.get_tracer("agentledger.executor")


class Unread:
    """The principal was not read with the command: :func:`refusal` reads it."""


UNREAD = Unread()


@dataclass(frozen=True)
class Checked:
    """:func:`refusal`'s answer: the refusal (None: go on) and the dispatch-time decision, if
    the policy was asked (written with the pre-call mark, or with a refusal's finalize)."""

    refusal: tuple[dispatch.FinalState, str] | None
    verdict: decision_mod.Decision | None = None
    row: asyncpg.Record | None = None
    action: str = ""

    def decision(self) -> dispatch.DispatchDecision | None:
        """The decision as the pre-call mark writes it."""
        if self.verdict is None or self.row is None:
            return None
        v, row = self.verdict, self.row
        return dispatch.DispatchDecision(
            v.decision_id, row["principal_id"], self.action, row["resource_id"], v.effect,
            v.policy_version, json.dumps(list(getattr(v, "reasons", ()))), v.reason)

    def also(self) -> dispatch.Also | None:
        """The decision as a refusal's finalize writes it (in the same transaction)."""
        verdict, row = self.verdict, self.row
        if verdict is None or row is None:
            return None

        async def decided(tx: repository.Conn) -> None:
            await policy_repo.record_decision(
                tx, verdict, tenant_id=row["tenant_id"], principal_id=row["principal_id"],
                action=self.action, resource_id=row["resource_id"],
                operation_id=row["operation_id"], stage="dispatch")
        return decided


@contextlib.asynccontextmanager
async def _connection(pool: asyncpg.Pool, conn: repository.Conn | None
                      ) -> AsyncIterator[repository.Conn]:
    """``conn``, or one of the pool's for the time of the block."""
    if conn is not None:
        yield conn
        return
    async with pool.acquire() as own:
        yield own


def principal_of(row: asyncpg.Record) -> cedar.Principal | None:
    """The principal as the claim's statement read it (``principal_*`` columns)."""
    if not row["principal_known"]:
        return None
    return cedar.Principal(row["tenant_id"], row["principal_id"],
                           frozenset(json.loads(row["principal_roles"])),
                           bool(row["principal_revoked"]))


async def refusal(
    pool: asyncpg.Pool, allowlist: allowlist_mod.Allowlist,
    authorizer: decision_mod.Authorizer, conn: repository.Conn | None, row: asyncpg.Record,
    *, principal: cedar.Principal | Unread | None = UNREAD,
) -> Checked:
    """R2.6: the decision must still be valid and the CURRENT policy must still permit.

    Returns the refusal (None: go on) and the dispatch-time decision, for the write that
    comes next: the finalize of a refusal, or the pre-call mark (so the decision is durable
    before any call, in no transaction of its own). ``principal``: the directory's record as
    the claim's statement read it; unread, it is read here (on ``conn``, or the pool's).
    """
    # R9.2: a shadow run never writes. Admission refuses shadow proposals; this second,
    # independent check denies a shadow command that reached the ledger anyway, before any
    # connector call (the flag comes with the command's row).
    if row["shadow"]:
        return Checked(("denied", "shadow command: shadow runs are recorded, never "
                        "dispatched"))
    if row["expires_at"] <= datetime.now(UTC):
        async with _connection(pool, conn) as c:
            return Checked(("expired", await dispatch.expiry_reason(
                c, row["tenant_id"], row["decision_id"])))
    if row["payload_ciphertext"] is None:
        return Checked(("expired", "the payload was purged before dispatch"))
    try:
        spec = allowlist.get(row["action"])
    except errors.UnknownAction:
        return Checked(("denied", f"{row['action']} is no longer on the allowlist"))
    with spans.span(tracer, "authorization", attributes={spans.STAGE: "dispatch"}) as authz:
        if isinstance(principal, Unread):
            async with _connection(pool, conn) as c:
                verdict = await authorizer.authorize(
                    c, tenant_id=row["tenant_id"], principal_id=row["principal_id"],
                    action=spec, resource_id=row["resource_id"])
        else:
            verdict = authorizer.authorize_known(
                principal, tenant_id=row["tenant_id"], principal_id=row["principal_id"],
                action=spec, resource_id=row["resource_id"])
        authz.set_attributes({spans.EFFECT: verdict.effect,
                              spans.POLICY_VERSION: verdict.policy_version})
    telemetry_metrics.authorizations.add(1, stage="dispatch", outcome=verdict.effect)
    # Only a denial stops a command: one a person approved stays approved (R2.6).
    if verdict.effect == "deny":
        why = common.reason_text(f"current policy denies it: {verdict.reason}")
        return Checked(("denied", why), verdict, row, spec.name)
    return Checked(None, verdict, row, spec.name)
