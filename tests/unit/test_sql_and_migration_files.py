from __future__ import annotations

from pathlib import Path

import pytest

from agentledger import errors, migrations, settings, sql


def test_named_queries_parse(tmp_path: Path) -> None:
    f = tmp_path / "q.sql"
    f.write_text("-- header comment\n-- name: one --\n-- purpose\nSELECT 1;\n\n-- name: two --\nSELECT $1;\n")
    assert sql.load(f) == {"one": "-- purpose\nSELECT 1;", "two": "SELECT $1;"}


def test_duplicate_query_names_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "dup.sql"
    f.write_text("-- name: one --\nSELECT 1;\n-- name: one --\nSELECT 2;\n")
    with pytest.raises(ValueError, match="defined twice"):
        sql.load(f)


def test_sql_before_first_header_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "stray.sql"
    f.write_text("SELECT 0;\n-- name: one --\nSELECT 1;\n")
    with pytest.raises(ValueError, match="before the first"):
        sql.load(f)


def test_repository_migrations_are_numbered_in_increasing_order() -> None:
    found = migrations.discover(settings.REPO_ROOT / "migrations")
    versions = [m.version for m in found]
    assert versions == sorted(set(versions)) and versions[0] == 1


def test_gap_in_versions_is_allowed_a_repeat_is_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    assert [m.version for m in migrations.discover(tmp_path)] == [1, 3]
    (tmp_path / "0003_d.sql").write_text("SELECT 1;")
    with pytest.raises(errors.MigrationError, match=r"0003_d\.sql after 0003_c\.sql"):
        migrations.discover(tmp_path)


def test_badly_named_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "1_a.sql").write_text("SELECT 1;")
    with pytest.raises(errors.MigrationError, match="bad migration file name"):
        migrations.discover(tmp_path)
