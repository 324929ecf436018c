"""An operator's resolution of an ``unknown`` command, checked before it is recorded (R6.6).

``agentledger reconcile resolve --by user:anyone --receipt anything`` used to be recorded as
given (issue 18 §3). A resolution is now an operator's word only where nothing better exists:

- **who**: the verified session's principal, a current operator in the principal directory
  (:func:`agentledger.policy.repository.require_operator`) — never a name typed on the line;
- **what**: checked with the connector's lookup (the reconciler's, with its lookup-scoped
  credential) wherever the contract has one, before anything is written:

  - the lookup finds the effect with the given receipt: ``succeeded`` is recorded
    *confirmed*; ``failed`` is refused;
  - it finds the effect with another receipt: refused;
  - it finds no effect for the key, inside the provider's retention: ``failed`` is recorded
    *confirmed*; ``succeeded`` is refused;
  - it cannot answer (no answer, no lookup credential, the connector not installed here, a
    key past the provider's retention, where "not found" proves nothing): refused, or
    recorded *unchecked* with ``allow_unchecked``;
  - the connector declares no lookup (billing refunds, contract ``none``): recorded
    *unchecked* — the operator's word and evidence are all there is.

  A contradiction is never overridable: the ledger would say what the provider denies. A
  lookup that cannot answer refuses by default — the provider may answer in a minute — and
  ``allow_unchecked`` is the explicit way out for an answer that will not come (a key the
  provider forgot, an error it recorded for the key): recorded as *unchecked*, with why.

The check and the resolution are not one transaction: the lookup is a network call and no
transaction is held across one (R5.4). The resolution itself still refuses a command that is
no longer ``unknown`` and an attempt that may still act.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID

import asyncpg
from opentelemetry import trace

from agentledger import errors, identity
from agentledger.connectors import base, boundary
from agentledger.contracts import common
from agentledger.ledger import dispatch, repository, resolutions
from agentledger.policy import repository as policy_repo
from agentledger.telemetry import spans

tracer = trace.get_tracer("agentledger.resolution")

Outcome = Literal["succeeded", "failed"]


@dataclass(frozen=True)
class Checked:
    """What a resolution rests on, as recorded with it."""

    check: dispatch.ReceiptCheck
    detail: str


@dataclass(frozen=True)
class Resolved:
    """A recorded resolution."""

    resolution_id: UUID
    resolved_by: str
    outcome: Outcome
    check: Checked
    # Why a late call may still land and contradict it; None: none can.
    provisional: str | None = None


async def resolve(
    conn: repository.Conn, directory: repository.Conn, operator: identity.Session,
    operation_id: UUID, *, outcome: Outcome, reason: str, receipt: str | None,
    evidence: str | None, connectors: Mapping[str, base.Connector],
    credentials: base.Credentials, override_acting: bool = False, allow_unchecked: bool = False,
    max_call_s: float = dispatch.MAX_CALL_S, now: datetime | None = None,
) -> Resolved:
    """Resolve an ``unknown`` command of the operator's tenant, as that operator.

    Args:
        conn: The ledger, as ``agentledger_reconciler``.
        directory: A connection that may read the principal directory (``agentledger_auditor``).
        operator: The caller's verified session (``operators.verify``).
        connectors: The installed connectors by name; ``credentials``: their lookup tokens.
        override_acting: Resolve although an attempt may still act (recorded).
        allow_unchecked: Record the resolution as unchecked when the lookup cannot answer.

    Raises:
        NotAnOperator: The directory does not record the session's principal as an operator.
        ValidationFailed: ``succeeded`` without a receipt.
        CommandNotFound, InvalidTransition: No such command here, or it is not ``unknown``.
        ReceiptContradicted: The provider's lookup contradicts the resolution.
        ReceiptUnverifiable: The lookup cannot answer, and no ``allow_unchecked``.
        AttemptMayStillAct: As :func:`resolutions.resolve_unknown`.
    """
    tenant_id = operator.tenant_id
    await policy_repo.require_operator(directory, tenant_id, operator.principal_id)
    if outcome == "succeeded" and not receipt:
        raise errors.ValidationFailed("a success needs the provider's receipt as evidence")
    row = await repository.load_command(conn, tenant_id, operation_id)
    if row["state"] != "unknown":
        raise errors.InvalidTransition(f"only an unknown command can be resolved (it is "
                                       f"{row['state']})", operation_id=str(operation_id))
    connector = connectors.get(row["connector"])
    # Fence first: once the provider refuses every earlier generation, no late call can land
    # after what is recorded below (issue 37).
    fence_failed = None
    if connector is not None and boundary.can_fence(connector):
        fence_failed = await _fence(conn, connector, credentials, row)
        if fence_failed is not None and not allow_unchecked:
            raise errors.ReceiptUnverifiable(
                f"{fence_failed}: a stalled earlier call could land after the resolution; try "
                "again later, or record it provisionally (--allow-unchecked)",
                connector=row["connector"])
    tried = await dispatch.attempts(conn, tenant_id, operation_id)
    with spans.span(tracer, "resolution.check", attributes={
            spans.OPERATION_ID: str(operation_id), spans.CONNECTOR: row["connector"]}):
        checked = await check(connector, credentials, row, tried,
                              outcome=outcome, receipt=receipt,
                              allow_unchecked=allow_unchecked, now=now)
    provisional = fence_failed or may_land(connector, tried, now=now)
    resolution_id = await resolutions.resolve_unknown(
        conn, tenant_id, operation_id, outcome=outcome, resolved_by=operator.principal_id,
        reason=reason, receipt=receipt, evidence=evidence, override_acting=override_acting,
        max_call_s=max_call_s, receipt_check=checked.check, check_detail=checked.detail,
        provisional=provisional)
    return Resolved(resolution_id, operator.principal_id, outcome, checked, provisional)


async def _fence(conn: repository.Conn, connector: base.Connector,
                 credentials: base.Credentials, row: Mapping[str, Any] | asyncpg.Record
                 ) -> str | None:
    """A new generation for the command and the provider's fence advanced to it; None when
    it was, else why not (audited either way)."""
    generation = await dispatch.advance_generation(conn, row["tenant_id"], row["operation_id"])
    token = credentials.token(connector.name, row["tenant_id"])
    answer: base.FenceResult
    if token is None:
        answer = base.NotSent(f"no lookup credential for connector {connector.name} and this "
                              "tenant")
    else:
        call = base.Call(row["tenant_id"], row["operation_id"], row["action"],
                         row["resource_id"], {}, row["expected_revision"],
                         fencing_generation=generation)
        answer = await boundary.fence(connector, call, token,
                                      bound_s=connector.contract.call_timeout_s)
    advanced = isinstance(answer, base.Advanced)
    why = "advanced" if advanced else common.reason_text(getattr(answer, "reason", "no answer"))
    await dispatch.fence_recorded(conn, row["tenant_id"], row["operation_id"], generation,
                                  advanced=advanced, detail=why)
    if advanced:
        return None
    return (f"the {connector.name} fence could not be advanced to generation {generation} "
            f"({why[:200]})")


def may_land(connector: base.Connector | None, tried: Sequence[Mapping[str, Any]], *,
             now: datetime | None = None) -> str | None:
    """Why a sent attempt's call may still land after a resolution recorded now, or None.

    None when no attempt may have reached the provider without an answer since, when the
    connector's provider is fenced (the resolution advanced the fence, :func:`resolve`), or
    when it honours request deadlines and the last one has passed.
    """
    in_flight = [a for a in tried if a.get("sent_at") is not None and a.get("late_answer") is None]
    if not in_flight:
        return None
    if connector is not None and boundary.can_fence(connector):
        return None
    if connector is not None and connector.contract.deadline:
        ends = max(a["sent_at"] for a in in_flight) + timedelta(
            seconds=connector.contract.call_timeout_s + dispatch.CALL_MARGIN_S)
        if (now or datetime.now(UTC)) >= ends:
            return None
        return (f"a late call may still land: the provider refuses requests past their "
                f"deadline, and the last one ({ends.isoformat(timespec='seconds')}) has not "
                "passed")
    name = connector.name if connector is not None else "its"
    return (f"a late call may still land: the {name} provider can neither be fenced nor "
            "refuse a request past its deadline, so a stalled attempt may still apply")


async def check(
    connector: base.Connector | None, credentials: base.Credentials,
    row: Mapping[str, Any] | asyncpg.Record,
    tried: Sequence[dict[str, Any]], *, outcome: Outcome, receipt: str | None,
    allow_unchecked: bool = False, now: datetime | None = None,
) -> Checked:
    """Check a resolution of the command ``row`` (its attempts: ``tried``) with the provider.

    Raises:
        ReceiptContradicted, ReceiptUnverifiable: see the module's table.
    """
    name = str(row["connector"])
    late = [a for a in tried if a.get("late_answer") == "applied"]
    if late:
        # The provider already answered an attempt of this command: applied.
        said, generation = late[-1]["late_receipt"], late[-1]["fencing_generation"]
        if outcome == "succeeded" and said == receipt:
            return Checked("confirmed", f"the provider's late answer to the attempt of "
                           f"generation {generation} applied it with this receipt")
        raise errors.ReceiptContradicted(
            f"the provider answered applied (receipt {str(said)[:200]}) to the attempt of "
            f"generation {generation}: "
            + ("not the receipt given" if outcome == "succeeded" else "it did not fail"),
            provider_receipt=str(said)[:200])

    def unanswered(why: str) -> Checked:
        if not allow_unchecked:
            raise errors.ReceiptUnverifiable(
                f"{why}; try again later, or record it as unchecked (--allow-unchecked)",
                connector=name)
        return Checked("unchecked", f"recorded unchecked by the operator: {why}")

    if connector is None:
        return unanswered(f"connector {name!r} is not installed here, its lookup cannot be asked")
    contract = connector.contract
    if not contract.lookup:
        return Checked("unchecked", f"connector {name} declares no lookup (contract "
                       f"{contract.idempotency}): the provider cannot be asked")
    token = credentials.token(name, row["tenant_id"])
    if token is None:
        return unanswered(f"no lookup credential for connector {name} and this tenant")
    call = base.Call(row["tenant_id"], row["operation_id"], row["action"], row["resource_id"],
                     {}, row["expected_revision"])
    found = await boundary.lookup(connector, call, token, bound_s=contract.call_timeout_s)
    if isinstance(found, base.Applied):
        if outcome == "succeeded" and found.receipt == receipt:
            return Checked("confirmed", f"the {name} lookup found the effect with this receipt")
        raise errors.ReceiptContradicted(
            f"the {name} lookup found the effect with receipt {found.receipt[:200]}: "
            + ("not the receipt given" if outcome == "succeeded" else "it did not fail"),
            provider_receipt=found.receipt[:200])
    if isinstance(found, base.NotFound):
        expired = dispatch.past_retention(tried, contract.retention, now=now)
        if expired:
            return unanswered(f"the {name} lookup found nothing, which proves nothing: {expired}")
        if outcome == "failed":
            return Checked("confirmed", f"the {name} lookup found no effect for the key")
        raise errors.ReceiptContradicted(
            f"the {name} lookup found no effect for this command's key: it did not succeed")
    return unanswered(f"the {name} lookup did not answer ({found.reason[:200]})")
