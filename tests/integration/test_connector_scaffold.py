"""``agentledger connector new``: the package it writes is a working connector whose tests run
the conformance kit — shown against a small API that keeps the scaffold's contract."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner

from agentledger import cli
from agentledger.connectors import conformance, plugins
from tests.helpers import serving


@pytest.fixture
async def api() -> AsyncIterator[str]:
    """What the scaffold's requests expect: keyed writes, a lookup by key, If-Match."""
    by_key: dict[str, str] = {}

    async def create(request: web.Request) -> web.Response:
        if request.headers.get("If-Match") not in (None, '"1"'):
            return web.json_response({"error": "stale"}, status=412)
        key = request.headers["Idempotency-Key"]
        made = by_key.setdefault(key, uuid.uuid4().hex)
        return web.json_response({"id": made}, status=201)

    async def operation(request: web.Request) -> web.Response:
        key = request.match_info["key"]
        found = by_key.get(key)
        return web.json_response({"id": found, "key": key}) if found else web.Response(status=404)

    app = web.Application()
    app.router.add_post("/v1/things/{thing}/examples", create)
    app.router.add_get("/v1/operations/{key}", operation)
    async with serving(app) as url:
        yield url


async def test_a_scaffolded_connector_keeps_its_contract_and_its_tests_run_the_kit(
    api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = CliRunner().invoke(cli.app, ["connector", "new", "tickets", "--dest",
                                        str(tmp_path / "agentledger-tickets")])
    assert made.exit_code == 0, made.output
    root = tmp_path / "agentledger-tickets"
    assert 'tickets = "agentledger_tickets:connector"' in (root / "pyproject.toml").read_text()
    monkeypatch.syspath_prepend(str(root))
    connector = plugins.make("tickets", {"factory": "agentledger_tickets:connector",
                                         "url": api})
    try:
        found = await conformance.check(conformance.Endpoint(
            connector=connector, tenant_id=uuid.uuid4(), write_token="t", lookup_token="t",
            sample=conformance.Sample("tickets.example.create", "th-1", {"text": "x"}),
            stale_revision="7",
            retarget=lambda t: plugins.make("tickets", {
                "factory": "agentledger_tickets:connector", "url": t.http_url})))
    finally:
        await connector.aclose()
    assert {f.claim: f.holds for f in found} == {
        "applies": True, "dedupes": True, "lookup_finds": True, "lookup_not_found": True,
        "if_match": True, "fencing": None, "lookup_ignores_lookalike": True, "answers": True}
    # Its own tests, as its author runs them, with the kit's pytest plugin (awaited: this
    # loop serves the API meanwhile).
    ran = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests"),
        cwd=root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path]),
             "TICKETS_URL": api, "TICKETS_TOKEN": "t", "TICKETS_TARGET": "th-2",
             "TICKETS_STALE_REVISION": "7"})
    output = (await asyncio.wait_for(ran.communicate(), 120))[0].decode()
    assert ran.returncode == 0 and "1 passed" in output, output


def test_an_existing_directory_or_a_bad_name_writes_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli.app, ["connector", "new", "Bad-Name", "--dest",
                                   str(tmp_path / "x")]).exit_code == 2
    assert not (tmp_path / "x").exists()
    (tmp_path / "y").mkdir()
    assert runner.invoke(cli.app, ["connector", "new", "ok", "--dest",
                                   str(tmp_path / "y")]).exit_code == 2
    assert list((tmp_path / "y").iterdir()) == []
