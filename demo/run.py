"""``agentledger demo``: bring the world up, play the scenarios, explain, leave it running."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from agentledger import db, errors, settings
from agentledger.audit import explain as audit_explain
from agentledger.cli import explain as cli_explain
from agentledger.kafka import logs as kafka_logs
from demo import commands, launch, scenarios, stack, stories_adoption

INTRO = (
    "A model may only PROPOSE an action. Ingress signs who asked, admission checks the "
    "allowlist, the tenant and the policy and admits the command once into the Postgres "
    "ledger, the relay carries it to Kafka, an executor performs it on the CRM. Below, eight "
    "stories on real processes (the last three: your own connector, e-mail to a real SMTP "
    "server; an MCP client; a REST API declared, not coded); after each, what the ledger, "
    "the CRM's effect log and the mail server say."
)


def _explain(world: launch.World, console: Console) -> None:
    ops = world.operations
    budget = ops.get("budget", {})
    shown = [("1 · note", ops.get("note")), ("2 · approved refund", ops.get("approved_refund")),
             ("3 · lost refund", ops.get("lost_refund")),
             ("5 · budget, admitted step", (budget.get("admitted") or [None])[0])]
    console.rule("[bold]What is known, per operation: agentledger explain")
    for title, op in shown:
        _explain_one(world, console, title, op)
    for op in budget.get("refused", [])[:1]:
        console.print(f"[bold]5 · budget, refused step[/bold] {op}: never admitted, so explain "
                      "shows only its audit event:", highlight=False)
        for event in asyncio.run(_audit(world, op)):
            console.print(f"  {event['type']}  {json.dumps(event['payload'])}", highlight=False,
                          markup=False)
    _explain_one(world, console, "6 · e-mail whose answer was lost", ops.get("email_lost"))
    console.print("[bold]4 · injection[/bold]: nothing to explain — all three were refused "
                  "before admission wrote anything (no command, no approval, no effect).")


def _explain_one(world: launch.World, console: Console, title: str, op: str | None) -> None:
    if op is None:
        return
    console.print(f"[bold]{title}[/bold]", highlight=False)
    commands.show(console, commands.cli(Path(world.home), "explain", op, "--tenant",
                                        str(world.tenant)))
    try:
        found = asyncio.run(_explanation(world, op))
    except errors.AgentLedgerError as exc:
        console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}", highlight=False)
        return
    cli_explain.render(found, console, settings.load().traces_url)


async def _explanation(world: launch.World, op: str) -> audit_explain.Explanation:
    """What ``agentledger explain`` answers, read the same way: as the auditor."""
    conn = await db.connect(world.database_url, role="agentledger_auditor")
    try:
        return await audit_explain.explain(conn, world.tenant, uuid.UUID(op))
    finally:
        await conn.close()


async def _audit(world: launch.World, op: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(world.database_url)
    try:
        rows = await conn.fetch("SELECT type, payload FROM audit_event WHERE operation_id = $1"
                                " ORDER BY seq", uuid.UUID(op))
    finally:
        await conn.close()
    return [{"type": r["type"], "payload": json.loads(r["payload"])} for r in rows]


def _write_commands_context(world: launch.World) -> None:
    """What the printed commands need, in the files they read (:mod:`demo.commands`)."""
    values = {"AGENTLEDGER_DATABASE_URL": world.database_url,
              "AGENTLEDGER_KAFKA_BOOTSTRAP": world.bootstrap,
              "AGENTLEDGER_CONSOLE_URL": world.console_url, **world.operator_env}
    if traces := settings.load().traces_url:
        values["AGENTLEDGER_TRACES_URL"] = traces
    commands.write(Path(world.home), values, world.tokens)


def _finish(world: launch.World, console: Console, started: float, browser_hints: bool
            ) -> None:
    console.rule("[bold]The stack is still running")
    home = Path(world.home)
    console.print(f"  ingress  {world.ingress_url}     console  {world.console_url}     "
                  f"CRM  {world.crm_url}", highlight=False)
    console.print(f"  ledger   {world.database_url}", highlight=False)
    console.print(f"  mailpit  {world.mailpit_url} (the e-mails sent)     "
                  f"mcp  {world.mcp_url}", highlight=False)
    console.print(f"  topics   {world.namespace}*  on {world.bootstrap}", highlight=False)
    console.print(f"  logs     {commands.shown(home / 'logs')}/     state (ids, tokens): "
                  f"{commands.shown(home / 'state.json')}", highlight=False)
    console.print("\n  Every command below works as printed, in any shell at the checkout's root "
                  f"({settings.REPO_ROOT}; the settings they need are in "
                  f"{commands.shown(home / 'env')}; to type `agentledger` alone, "
                  "`source .venv/bin/activate` first).", highlight=False)
    if browser_hints:
        bob = commands.token_file(home, "user:bob")
        console.print(
            "\n  [bold]Try the approval console[/bold]: a 120.00 EUR refund is waiting for bob, "
            f"an approver of tenant Acme. Open {world.console_url}/signin and paste bob's "
            "session token (the demo has no passwords: the console signs in with the token its "
            f"identity provider issued, a {len(world.tokens['user:bob'])}-character line); "
            "this prints it:", highlight=False)
        commands.show(console, f"cat {commands.shown(bob)}")
        console.print("  or review it from this shell, as bob:", highlight=False)
        commands.show(console, commands.with_token(home, "user:bob",
                                                   commands.cli(home, "approvals", "list")))
    console.print("\n  What runs (the demo's services, Kafka, PostgreSQL):", highlight=False)
    commands.show(console, commands.make(home, "status"))
    console.print("  Stop all of it:", highlight=False)
    commands.show(console, commands.make(home, "down"))
    console.print(f"  demo finished in {time.monotonic() - started:.0f} s", highlight=False)


async def _play(world: launch.World, console: Console, browser_hints: bool) -> None:
    await scenarios.play(world, console, browser_hints=browser_hints)
    await stories_adoption.play(world, console)


def _log_librdkafka(home: Path) -> None:
    """librdkafka's lines of this process (its admin clients, the gateway's consumers) go to
    the demo's own log, never into the narration."""
    (home / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(home / "logs" / "demo.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    kafka_logs.LIBRDKAFKA.addHandler(handler)
    kafka_logs.LIBRDKAFKA.setLevel(logging.INFO)
    kafka_logs.LIBRDKAFKA.propagate = False


def main(*, browser_hints: bool = True, database: str = "agentledger_demo",
         namespace: str = "demo", home: Path | None = None, console: Console | None = None
         ) -> None:
    """Run the demo; exits non-zero with the fix to try when a step fails."""
    opts = launch.Options(home=home or settings.demo_home(), database=database,
                          prefix=namespace)
    out = console or Console()
    started = time.monotonic()
    _log_librdkafka(opts.home)
    out.rule("[bold]agentledger demo")
    out.print(INTRO, highlight=False)
    try:
        with out.status("starting…", spinner="dots") as status:
            def step(text: str) -> None:
                status.update(f"{text}…")
                out.print(f"  [dim]· {escape(text)}[/dim]", highlight=False)

            def progress(text: str) -> None:
                status.update(f"{text}…")

            world = launch.launch(opts, step, progress)
        _write_commands_context(world)
        out.print(f"  [dim]· everything up in {time.monotonic() - started:.0f} s[/dim]",
                  highlight=False)
        # The operator's steps (reconcile, explain) run in this process, on the demo ledger,
        # verifying sessions with the demo identity provider's keys.
        os.environ["AGENTLEDGER_DATABASE_URL"] = world.database_url
        os.environ.update(world.operator_env)
        asyncio.run(_play(world, out, browser_hints))
        _explain(world, out)
    except stack.DemoError as exc:
        out.print(f"[red]demo failed[/red]: {escape(str(exc))}", highlight=False)
        if exc.fix:
            out.print(f"[yellow]try[/yellow]: {escape(exc.fix)}", highlight=False)
        raise typer.Exit(1) from exc
    except (TimeoutError, RuntimeError, AssertionError, errors.AgentLedgerError) as exc:
        out.print(f"[red]demo failed[/red]: {escape(str(exc) or type(exc).__name__)}",
                  highlight=False)
        out.print(f"[yellow]try[/yellow]: read the service logs in "
                  f"{commands.shown(opts.home / 'logs')}; `{commands.make(opts.home, 'status')}` "
                  f"shows what runs, `{commands.make(opts.home, 'down')}` stops it",
                  highlight=False)
        raise typer.Exit(1) from exc
    _finish(world, out, started, browser_hints)
