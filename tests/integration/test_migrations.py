"""The migration runner: ordered, recorded with checksums, locked, and strict about edits."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa

from agentledger import errors, migrations, settings
from agentledger.ledger import tables

MIGRATIONS = settings.REPO_ROOT / "migrations"


def _sync_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def test_migrated_schema_matches_the_declared_tables(database_url: str) -> None:
    engine = sa.create_engine(_sync_url(database_url))
    try:
        inspector = sa.inspect(engine)
        actual = set(inspector.get_table_names()) - {"agentledger_migrations"}
        assert actual == set(tables.metadata.tables)
        for table in tables.metadata.sorted_tables:
            reflected = {c["name"]: c for c in inspector.get_columns(table.name)}
            assert set(reflected) == {c.name for c in table.columns}, table.name
            for column in table.columns:
                got = reflected[column.name]
                assert got["nullable"] == column.nullable, (table.name, column.name)
                assert type(got["type"])._type_affinity is column.type._type_affinity or (  # type: ignore[attr-defined]
                    got["type"].compile(dialect=engine.dialect)
                    == column.type.compile(dialect=engine.dialect)
                ), (table.name, column.name, got["type"], column.type)
            pk = inspector.get_pk_constraint(table.name)["constrained_columns"]
            assert pk == [c.name for c in table.primary_key.columns], table.name
            fks = {(tuple(fk["constrained_columns"]), fk["referred_table"]) for fk in inspector.get_foreign_keys(table.name)}
            declared = {
                (tuple(c.column_keys), next(iter(c.elements)).column.table.name)
                for c in table.foreign_key_constraints
            }
            assert fks == declared, table.name
    finally:
        engine.dispose()


async def test_runner_is_idempotent_and_safe_under_concurrency(make_database: Callable[[], str]) -> None:
    # Run the real files on an emptied database from scratch, four runners at once.
    url = make_database()
    conn = await asyncpg.connect(url)
    await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    await conn.execute("DROP PUBLICATION IF EXISTS agentledger_outbox")
    await conn.close()

    results = await asyncio.gather(*(migrations.migrate(url, MIGRATIONS) for _ in range(4)))
    applied_now = sorted(m.version for r in results for m in r)
    assert applied_now == [m.version for m in migrations.discover(MIGRATIONS)]
    assert await migrations.migrate(url, MIGRATIONS) == []
    recorded = await migrations.applied_versions(url)
    assert [(v, c) for v, _, c in recorded] == [(m.version, m.checksum) for m in migrations.discover(MIGRATIONS)]


async def test_runner_refuses_an_edited_applied_file(database_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, copy)
    first = sorted(copy.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- an innocent-looking edit\n")
    with pytest.raises(errors.MigrationError, match="changed after it was applied"):
        await migrations.migrate(database_url, copy)


async def test_failed_migration_rolls_back_alone(database_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, copy)
    n = migrations.discover(copy)[-1].version
    (copy / f"{n + 1:04d}_broken.sql").write_text(
        "CREATE TABLE should_not_survive (id int);\nSELECT * FROM no_such_table;\n"
    )
    with pytest.raises(errors.MigrationError, match=r"broken\.sql failed"):
        await migrations.migrate(database_url, copy)
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT to_regclass('should_not_survive')") is None
        assert await conn.fetchval("SELECT max(version) FROM agentledger_migrations") == n
    finally:
        await conn.close()
