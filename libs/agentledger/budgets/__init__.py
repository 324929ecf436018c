"""Bounded runtime: per-workflow budgets reserved atomically in Postgres (R7).

``from agentledger import budgets`` → ``budgets.open``, ``budgets.reserve``, ``budgets.commit``,
``budgets.release``, ``budgets.remaining``, ``budgets.reservations_for``.
"""

from agentledger.budgets.repository import (
    KINDS,
    Balance,
    Kind,
    Reservation,
    commit,
    open,
    open_default,
    release,
    remaining,
    reservations_for,
    reserve,
)

__all__ = [
    "KINDS",
    "Balance",
    "Kind",
    "Reservation",
    "commit",
    "open",
    "open_default",
    "release",
    "remaining",
    "reservations_for",
    "reserve",
]
