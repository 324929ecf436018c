"""Model tokens are reserved before each model call, outside the model's reach (R7.1-R7.3).

The planner holds no table privilege: it opens the request's budget from the tenant's
operator-set default and reserves/settles through SECURITY DEFINER functions (migrations
0003 and 0008), as role ``agentledger_planner``. A reservation is idempotent per operation,
so a redelivered request after a crash does not spend the budget twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from agentledger import budgets, errors
from agentledger.planning import adapters

Planned = adapters.Plan | adapters.Refusal


@dataclass
class TokenBudget:
    """Reserve ``per_call`` tokens before a call, settle with what the call used."""

    pool: asyncpg.Pool
    # What one plan may cost at most: the reservation must cover the worst case before the
    # call, since the model reports usage only afterwards.
    per_call: int = 4_000

    async def around(
        self, tenant_id: UUID, workflow_id: str, operation_id: UUID,
        call: Callable[[], Awaitable[Planned]],
    ) -> Planned:
        """Run ``call`` under a reservation.

        Raises:
            BudgetExhausted: the request's token budget cannot cover another call (audited
                by the database as ``budget.exhausted``); no model call was made.
        """
        async with self.pool.acquire() as conn:
            if not await budgets.open_default(conn, tenant_id, workflow_id, "model_tokens"):
                raise errors.BudgetExhausted(
                    "no model-token budget is configured for this tenant", reason="no_budget",
                    kind="model_tokens", workflow_id=workflow_id)
            held = await budgets.reserve(conn, tenant_id, workflow_id, "model_tokens",
                                         self.per_call, operation_id=operation_id)
        try:
            result = await call()
        except BaseException:
            async with self.pool.acquire() as conn:
                await budgets.release(conn, held)
            raise
        used = result.usage.prompt_tokens + result.usage.completion_tokens
        async with self.pool.acquire() as conn:
            await budgets.commit(conn, held, min(used, self.per_call))
        return result
