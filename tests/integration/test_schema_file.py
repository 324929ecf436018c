"""The committed ``migrations/schema.sql`` is exactly what a fresh migration run produces
(procrastinate's schema test): a reader of that one file reads the schema production runs."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from agentledger import migrations, settings
from tests import stack as stack_mod

MIGRATIONS = settings.REPO_ROOT / "migrations"


def _diff(expected: str, actual: str) -> str:
    return "".join(difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True),
        "migrations/schema.sql (committed)", "fresh migration run", n=2))


async def test_a_fresh_migration_run_yields_the_committed_schema(stack: stack_mod.Stack) -> None:
    actual = await migrations.fresh_schema(stack.database_url, MIGRATIONS)
    expected = migrations.SCHEMA_FILE.read_text(encoding="utf-8")
    if actual != expected:
        pytest.fail("migrations/schema.sql is not what the migrations produce; if the "
                    f"migrations are right, regenerate it:\n    {migrations.REGENERATE}\n"
                    + _diff(expected, actual), pytrace=False)


async def test_a_schema_change_in_a_new_migration_shows_in_the_comparison(
    stack: stack_mod.Stack, tmp_path: Path
) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, copy)
    n = len(migrations.discover(copy))
    (copy / f"{n + 1:04d}_stray.sql").write_text("CREATE TABLE stray_table (id int);\n")
    actual = await migrations.fresh_schema(stack.database_url, copy)
    diff = _diff(migrations.SCHEMA_FILE.read_text(encoding="utf-8"), actual)
    assert "+CREATE TABLE public.stray_table (" in diff, diff
