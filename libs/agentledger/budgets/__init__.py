"""Bounded runtime: per-workflow budgets reserved atomically in Postgres (R7).

``from agentledger import budgets`` → ``budgets.open``, ``budgets.reserve``, ``budgets.commit``,
``budgets.release``, ``budgets.remaining``, ``budgets.reservations_for``; ``open_in``,
``reserve_in`` and ``settle_in`` run inside a caller's tenant-bound transaction.
"""

from agentledger.budgets.repository import (
    KINDS,
    Balance,
    Kind,
    Reservation,
    commit,
    open,
    open_default,
    open_in,
    release,
    remaining,
    reservations_for,
    reserve,
    reserve_in,
    settle_in,
)

__all__ = [
    "KINDS",
    "Balance",
    "Kind",
    "Reservation",
    "commit",
    "open",
    "open_default",
    "open_in",
    "release",
    "remaining",
    "reservations_for",
    "reserve",
    "reserve_in",
    "settle_in",
]
