"""``agentledger connector test``: the conformance kit against a real endpoint."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console

from agentledger import errors, settings
from agentledger.cli import group
from agentledger.connectors import conformance, plugins

app = typer.Typer(cls=group.Group, no_args_is_help=True,
                  help="Connectors: check one against its endpoint.")
console = Console()
_OBJECT = TypeAdapter(dict[str, Any])


class _Configured(settings.PolicySources):
    connectors: settings.ConnectorOptions = None


def _json(name: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        return _OBJECT.validate_json(text)
    except ValidationError as exc:
        console.print(f"[red]{name}[/red] is not a JSON object: {exc.errors()[0]['msg']}")
        raise typer.Exit(2) from exc


@app.command("test")
def test_cmd(
    name: Annotated[str, typer.Argument(help="The connector's name (its entry point)")],
    tenant: Annotated[uuid.UUID, typer.Option(help="A test tenant the tokens write in")],
    action: Annotated[str, typer.Option(help="The sample call's action")],
    target: Annotated[str, typer.Option(help="The sample call's target")],
    arguments: Annotated[str, typer.Option(help="The sample call's arguments (JSON)")] = "{}",
    url: Annotated[str | None, typer.Option(help="The endpoint (option 'url')")] = None,
    options: Annotated[str | None, typer.Option(
        help="The connector's options (JSON); default: its AGENTLEDGER_CONNECTORS entry")] = None,
    token: Annotated[str, typer.Option(help="A write-scoped token", envvar=
                                       "AGENTLEDGER_CONNECTOR_TEST_TOKEN")] = "",
    lookup_token: Annotated[str | None, typer.Option(help="A lookup-scoped token (default: "
                                                     "the write token)")] = None,
    revision: Annotated[str | None, typer.Option(help="The target's current revision")] = None,
    stale_revision: Annotated[str | None, typer.Option(
        help="A revision of the target that is NOT current: checks If-Match")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON")] = False,
) -> None:
    """Check every claim of the connector's declared contract against the real endpoint
    (it writes there: use a test tenant). Exit 1 when a claim does not hold."""
    found = _json("--options", options) if options is not None else dict(
        (_Configured().connectors or {}).get(name, {}))
    if url is not None:
        found["url"] = url
    try:
        connector = plugins.make(name, found)
    except errors.ConfigurationError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}", highlight=False)
        raise typer.Exit(2) from exc
    endpoint = conformance.Endpoint(
        connector=connector, tenant_id=tenant, write_token=token,
        lookup_token=lookup_token if lookup_token is not None else token,
        sample=conformance.Sample(action, target, _json("--arguments", arguments), revision),
        stale_revision=stale_revision,
        # The `answers` claim: the same connector, its endpoints the kit's hostile stand-ins.
        retarget=lambda t: plugins.make(name, plugins.retargeted(
            found, http_url=t.http_url, smtp_host=t.smtp_host, smtp_port=t.smtp_port)))

    async def run() -> list[conformance.Finding]:
        try:
            return await conformance.check(endpoint)
        finally:
            await connector.aclose()

    findings = asyncio.run(run())
    if as_json:
        print(json.dumps([vars(f) for f in findings], indent=2))
    else:
        for f in findings:
            mark = {True: "[green]holds[/green]", False: "[red]FAILS[/red]",
                    None: "[dim]not checked[/dim]"}[f.holds]
            console.print(f"{mark:>24}  {f.claim}: {f.detail}", highlight=False)
    raise typer.Exit(1 if conformance.failed(findings) else 0)


_NEW_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# Template → where it goes in the new package ({name} is the connector's name).
_SCAFFOLD = {"pyproject.toml.tmpl": "pyproject.toml",
             "package.py.tmpl": "agentledger_{name}/__init__.py",
             "test_conformance.py.tmpl": "tests/test_conformance.py"}


def scaffold(name: str, dest: Path) -> list[Path]:
    """Write a connector package for ``name`` into ``dest`` (which must not exist).

    Raises:
        ConfigurationError: an unusable name, or ``dest`` exists.
    """
    if not _NEW_NAME.fullmatch(name):
        raise errors.ConfigurationError(
            "a connector name is 1-32 of a-z, 0-9 and _, starting with a letter", name=name)
    if dest.exists():
        raise errors.ConfigurationError(f"{dest} exists; nothing was written", path=str(dest))
    templates = resources.files("agentledger.connectors").joinpath("scaffold")
    written = []
    for template, target in _SCAFFOLD.items():
        path = dest / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(templates.joinpath(template).read_text(encoding="utf-8").format(
            name=name, upper=name.upper()), encoding="utf-8")
        written.append(path)
    return written


@app.command("new")
def new_cmd(
    name: Annotated[str, typer.Argument(help="The connector's name (a-z, 0-9, _)")],
    dest: Annotated[Path | None, typer.Option(help="Where (default ./agentledger-NAME)")] = None,
) -> None:
    """Scaffold a connector package: an entry point, a contract, a resolver, and the
    conformance kit wired into its tests."""
    where = dest or Path(f"agentledger-{name}")
    try:
        written = scaffold(name, where)
    except errors.ConfigurationError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}", highlight=False)
        raise typer.Exit(2) from exc
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    console.print(f"next: fill in the TODOs, `pip install -e {where}`, then run its tests "
                  "against a test tenant of the real API", highlight=False)
