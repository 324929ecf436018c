"""Per-workflow budgets: model tokens, tool calls, concurrent steps and a deadline (R7).

A reservation is one atomic statement in Postgres (``agentledger_budget_reserve``): no two
workers ever see the same remaining balance, and past the limit or the deadline nothing is
reserved, the refusal is audited (``budget.exhausted``) and :class:`errors.BudgetExhausted`
is raised. A reservation is settled once, after the authoritative terminal event: committed
with the amount actually used (the rest returns to the budget) or released.

The reserve and settle statements run as SECURITY DEFINER functions, so the planner, which
holds no table privilege, can reserve tokens before each model call (see migration 0003).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args
from uuid import UUID

from agentledger import errors, sql
from agentledger.ledger import repository as ledger

Q = sql.load(Path(__file__).with_name("queries.sql"))

Kind = Literal["model_tokens", "tool_calls", "concurrent_steps"]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
State = Literal["reserved", "committed", "released"]

# The migration's CHECK on workflow_id; refused here first with a clear error.
MAX_WORKFLOW_ID_CHARS: Final = 200


@dataclass(frozen=True)
class Balance:
    """One kind of a workflow's budget."""

    kind: Kind
    limit: int
    reserved: int
    used: int
    deadline: datetime | None

    @property
    def remaining(self) -> int:
        """What can still be reserved (before the deadline)."""
        return self.limit - self.reserved - self.used


@dataclass(frozen=True)
class Reservation:
    """A reservation against one kind of a workflow's budget.

    Attributes:
        used_amount: What was committed; ``None`` while reserved, 0 once released.
    """

    reservation_id: UUID
    tenant_id: UUID
    workflow_id: str
    kind: Kind
    amount: int
    state: State
    used_amount: int | None = None
    operation_id: UUID | None = None


def _check_names(workflow_id: str, kind: str) -> None:
    if not 0 < len(workflow_id) <= MAX_WORKFLOW_ID_CHARS:
        raise errors.ValidationFailed(
            f"workflow_id must have 1 to {MAX_WORKFLOW_ID_CHARS} characters")
    if kind not in KINDS:
        raise errors.ValidationFailed(f"unknown budget kind; expected one of {', '.join(KINDS)}")


def _balance(row: Any) -> Balance:
    return Balance(row["kind"], int(row["limit_amount"]), int(row["reserved"]),
                   int(row["used"]), row["deadline"])


# Shadows the builtin in this module only, so that call sites read `budgets.open(...)`.
async def open(
    conn: ledger.Conn, tenant_id: UUID, workflow_id: str, limits: Mapping[Kind, int],
    deadline: datetime | None, *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> dict[Kind, Balance]:
    """Open a workflow's budgets, one per kind in ``limits``; opening again changes nothing.

    Args:
        conn: A connection whose role may insert budgets (``agentledger_admission``).
        limits: The limit of each kind, from trusted configuration (never from a model).
        deadline: The wall-clock deadline of the workflow; no reservation after it.

    Returns:
        The workflow's balances after opening (the first open's limits win).
    """
    async with ledger.transaction(conn, tenant_id, timeout=timeout) as tx:
        await open_in(tx, tenant_id, workflow_id, limits, deadline)
        rows = await tx.fetch(Q["balances"], tenant_id, workflow_id)
    return {r["kind"]: _balance(r) for r in rows}


async def open_in(
    tx: ledger.Conn, tenant_id: UUID, workflow_id: str, limits: Mapping[Kind, int],
    deadline: datetime | None,
) -> None:
    """:func:`open` inside the caller's transaction, bound to ``tenant_id`` (admission opens,
    reserves and admits in one), without reading the balances back."""
    for kind, limit in limits.items():
        _check_names(workflow_id, kind)
        if limit < 0:
            raise errors.ValidationFailed("a budget limit cannot be negative")
    kinds = sorted(limits)
    await tx.execute(Q["open_budget"], tenant_id, workflow_id, kinds,
                     [limits[k] for k in kinds], deadline)


async def open_default(
    conn: ledger.Conn, tenant_id: UUID, workflow_id: str, kind: Kind,
    *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> bool:
    """Open a workflow's budget of ``kind`` from the tenant's default (set by operators).

    For callers that may not choose limits (the planner). Returns whether the budget exists
    now; False means the tenant has no default for this kind (the caller runs unbudgeted or
    refuses, by its own configuration).
    """
    _check_names(workflow_id, kind)
    async with ledger.transaction(conn, tenant_id, timeout=timeout) as tx:
        opened = await tx.fetchval(Q["open_default"], tenant_id, workflow_id, kind)
    return bool(opened)


async def remaining(
    conn: ledger.Conn, tenant_id: UUID, workflow_id: str,
    *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> dict[Kind, Balance]:
    """The workflow's balances by kind (empty when no budget was opened)."""
    async with ledger.transaction(conn, tenant_id, timeout=timeout) as tx:
        rows = await tx.fetch(Q["balances"], tenant_id, workflow_id)
    return {r["kind"]: _balance(r) for r in rows}


async def reserve(
    conn: ledger.Conn, tenant_id: UUID, workflow_id: str, kind: Kind, amount: int,
    *, operation_id: UUID | None = None, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> Reservation:
    """Reserve ``amount`` of ``kind`` atomically, or refuse.

    Runs in its own transaction, so a refusal's audit event is committed before the error
    is raised (nested in a caller's transaction it becomes a savepoint: the caller decides).

    Args:
        conn: A connection whose role may execute the budget functions (planner, admission,
            executor, reconciler).
        operation_id: The command this reservation is for, when there is one.

    Raises:
        errors.BudgetExhausted: Not enough left, the deadline passed, or no budget of this
            kind was opened (``details["reason"]``: ``exhausted``, ``deadline_passed``,
            ``no_budget``); audited as ``budget.exhausted``.
        errors.ValidationFailed: A non-positive amount, an unknown kind.
    """
    async with ledger.transaction(conn, tenant_id, timeout=timeout) as tx:
        found = await reserve_in(tx, tenant_id, workflow_id, kind, amount,
                                 operation_id=operation_id)
    if isinstance(found, errors.BudgetExhausted):
        raise found
    return found


async def reserve_in(
    tx: ledger.Conn, tenant_id: UUID, workflow_id: str, kind: Kind, amount: int,
    *, operation_id: UUID | None = None,
) -> Reservation | errors.BudgetExhausted:
    """:func:`reserve` inside the caller's transaction, bound to ``tenant_id``.

    A refusal is returned, not raised: its audit event is written in the caller's
    transaction, which should commit it (raising would roll it back with everything else).
    """
    _check_names(workflow_id, kind)
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise errors.ValidationFailed("a reservation amount must be a positive integer")
    row = await tx.fetchrow(Q["reserve"], tenant_id, workflow_id, kind, amount, operation_id)
    if row is None:  # the function always returns one row
        raise errors.StorageError("budget reservation returned no row")
    if row["outcome"] != "reserved":
        left = None if row["limit_amount"] is None else (
            int(row["limit_amount"]) - int(row["reserved"]) - int(row["used"]))
        return errors.BudgetExhausted(
            f"{kind} budget of workflow {workflow_id}: {row['outcome'].replace('_', ' ')}",
            kind=kind, workflow_id=workflow_id, reason=row["outcome"], requested=amount,
            remaining=left,
        )
    return Reservation(row["reservation_id"], tenant_id, workflow_id, kind, amount, "reserved",
                       operation_id=operation_id)


async def _settle(
    conn: ledger.Conn, reservation: Reservation, used: int | None, timeout: float
) -> Reservation:
    async with ledger.transaction(conn, reservation.tenant_id, timeout=timeout) as tx:
        return await settle_in(tx, reservation, used)


async def settle_in(tx: ledger.Conn, reservation: Reservation, used: int | None) -> Reservation:
    """Commit (``used``) or release (None) inside the caller's transaction, bound to the
    reservation's tenant; see :func:`commit` and :func:`release`."""
    if used is not None and (isinstance(used, bool) or not isinstance(used, int)
                             or not 0 <= used <= reservation.amount):
        raise errors.ValidationFailed("used must be an integer between 0 and the amount reserved")
    row = await tx.fetchrow(Q["settle"], reservation.tenant_id, reservation.reservation_id, used)
    if row is None:
        raise errors.ValidationFailed("no such budget reservation in this tenant",
                                      reservation_id=str(reservation.reservation_id))
    return _reservation(reservation.tenant_id, row)


def _reservation(tenant_id: UUID, row: Any) -> Reservation:
    return Reservation(
        row["reservation_id"], tenant_id, row["workflow_id"], cast(Kind, row["kind"]),
        int(row["amount"]), cast(State, row["state"]),
        None if row["used_amount"] is None else int(row["used_amount"]), row["operation_id"],
    )


async def commit(
    conn: ledger.Conn, reservation: Reservation, used: int,
    *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> Reservation:
    """Settle with the amount actually used (≤ reserved); the rest returns to the budget.

    Idempotent by reservation id: once settled (committed or released), the recorded
    settlement is returned and nothing changes. A concurrency slot is returned even when
    committed: it bounds parallelism, it is not consumed.

    Raises:
        errors.ValidationFailed: ``used`` outside ``0..amount``, or no such reservation.
    """
    return await _settle(conn, reservation, used, timeout)


async def release(
    conn: ledger.Conn, reservation: Reservation, *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> Reservation:
    """Return the whole reservation to the budget; idempotent like :func:`commit`."""
    return await _settle(conn, reservation, None, timeout)


async def reservations_for(
    conn: ledger.Conn, tenant_id: UUID, operation_id: UUID,
    *, timeout: float = ledger.DEFAULT_TX_TIMEOUT_S,
) -> list[Reservation]:
    """The reservations held for one command, oldest first."""
    async with ledger.transaction(conn, tenant_id, timeout=timeout) as tx:
        rows = await tx.fetch(Q["reservations_for"], tenant_id, operation_id)
    return [_reservation(tenant_id, r) for r in rows]
