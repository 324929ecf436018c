"""Service logins on a shared cluster (issue 17 §7): sessions on one cluster, each with its
own database, never take each other's logins away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from agentledger import logins


async def _who(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT session_user"))
    finally:
        await conn.close()


def test_a_second_session_on_the_cluster_keeps_the_first_ones_logins(
        make_database: Callable[[], str]) -> None:
    # Two test pipelines (or the demo beside a test run) on one Postgres, each with its own
    # database. Roles are cluster-wide: when each session derived its own password (from its
    # database's URL), the second `ensure` locked the first session's services out the next
    # time they connected — a chaos run beside a benchmark failed every restart that way.
    first, second = make_database(), make_database()
    urls = asyncio.run(logins.ensure(first))
    asyncio.run(logins.ensure(second))
    assert asyncio.run(_who(urls["executor"])) == "agentledger_executor_login"
    assert asyncio.run(_who(urls["admission"])) == "agentledger_admission_login"
