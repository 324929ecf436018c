"""Fixtures of the integration tier (real Kafka and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

AsRole = Callable[[str], Awaitable[asyncpg.Connection]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
async def as_role(database_url: str) -> AsyncIterator[AsRole]:
    """Factory: a connection to this module's database acting as one role (SET ROLE)."""
    conns: list[asyncpg.Connection] = []

    async def connect(role: str) -> asyncpg.Connection:
        conn = await asyncpg.connect(database_url)
        await conn.execute(f'SET ROLE "{role}"')
        conns.append(conn)
        return conn

    yield connect
    for c in conns:
        await c.close()
