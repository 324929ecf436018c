"""Normalizing pg_dump's output for the committed schema file (no database)."""

from __future__ import annotations

from pathlib import Path

from agentledger import migrations

_DUMP = """\\restrict AbC123
--
-- PostgreSQL database dump
--

-- Dumped from database version 15.18
-- Dumped by pg_dump version 15.18

SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);


--
-- Name: f(); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

ALTER FUNCTION public.f() OWNER TO agentledger_sweeper;

--
-- Name: t; Type: TABLE; Schema: public; Owner: migrator
--

CREATE TABLE public.t (id integer);

ALTER TABLE public.t OWNER TO migrator;

\\unrestrict AbC123
"""


def test_volatile_lines_and_the_migrators_ownership_are_left_out() -> None:
    text = migrations.normalize_dump(_DUMP, "migrator")
    assert "restrict" not in text and "Dumped" not in text and "SET " not in text
    assert "set_config" not in text
    assert "OWNER TO migrator" not in text
    assert "-- Name: t; Type: TABLE; Schema: public\n" in text
    # A definer's owner is part of the schema (it decides the function's rights).
    assert "ALTER FUNCTION public.f() OWNER TO agentledger_sweeper;" in text
    assert "Owner: agentledger_sweeper" in text
    assert "\n\n\n" not in text


def test_discover_skips_the_schema_file(tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("SELECT 1;\n")
    (tmp_path / migrations.SCHEMA_FILE_NAME).write_text("-- generated\n")
    assert [m.name for m in migrations.discover(tmp_path)] == ["first"]


def test_the_committed_schema_file_states_how_to_regenerate_it() -> None:
    head = migrations.SCHEMA_FILE.read_text(encoding="utf-8")[:2000]
    assert migrations.REGENERATE in head
    assert "versioned name" in head
