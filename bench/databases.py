"""Fresh databases for one benchmark run: a migrated template, copied per phase, all dropped.

The same approach as ``tests/conftest.py``: migrate once into a template, then
``CREATE DATABASE ... TEMPLATE`` (a file copy, far faster than migrating again) for each
phase, so no phase sees another's rows or bloat.
"""

from __future__ import annotations

import asyncio
import uuid
from types import TracebackType

import psycopg2

from agentledger import db, migrations, settings


def admin_exec(url: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


class Databases:
    """Creates the run's databases on the server of ``admin_url`` and drops them on exit."""

    def __init__(self, admin_url: str, run_tag: str) -> None:
        self.admin_url = admin_url
        self.tag = run_tag
        self.created: list[str] = []
        self._template: str | None = None
        self._meter: str | None = None

    def _create(self, suffix: str, template: str | None = None) -> str:
        name = f"al_bench_{self.tag}_{suffix}_{uuid.uuid4().hex[:6]}"
        clause = f' TEMPLATE "{template}"' if template else ""
        admin_exec(self.admin_url, f'CREATE DATABASE "{name}"{clause}')
        self.created.append(name)
        return name

    def template(self) -> str:
        """The migrated template's name (created on first use)."""
        if self._template is None:
            name = self._create("tmpl")
            url = db.with_database(self.admin_url, name)
            asyncio.run(migrations.migrate(url, settings.REPO_ROOT / "migrations"))
            self._template = name
        return self._template

    def fresh(self, suffix: str) -> str:
        """URL of a new database with every migration applied."""
        return db.with_database(self.admin_url, self._create(suffix, self.template()))

    def empty(self, suffix: str) -> str:
        """URL of a new, empty database (for the peer engine's own tables)."""
        return db.with_database(self.admin_url, self._create(suffix))

    def meter_url(self) -> str:
        """URL of the run's database for reading the server's counters (bench.meter): the
        extensions it reads through are created there, not in a database anyone else uses."""
        if self._meter is None:
            url = self.empty("meter")
            for extension in ("pg_stat_statements", "pg_walinspect"):
                admin_exec(url, f"CREATE EXTENSION IF NOT EXISTS {extension}")
            self._meter = url
        return self._meter

    def drop_all(self) -> None:
        """Drop leftover replication slots in our databases, then the databases."""
        if not self.created:
            return
        admin_exec(self.admin_url,
                   "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                   " WHERE database = ANY(%s) AND NOT active", (self.created,))
        for name in reversed(self.created):
            admin_exec(self.admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()

    def __enter__(self) -> Databases:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.drop_all()
