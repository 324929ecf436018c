"""``agentledger eval``: compare planner candidates on the fixed eval set (R9.1-R9.3).

Mounted by the main CLI with ``app.command("eval")(eval.eval_command)``. Exit codes: 0 the
table was printed; 2 bad usage or a dataset that does not match its manifest; 3 the eval
refused a scope widening (a modified allowlist or policy, or a candidate that would pass
only with one).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentledger import errors, settings
from agentledger.connectors import plugins
from agentledger.evals import dataset, runner, scoring
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar

console = Console()
EXIT_USAGE = 2
EXIT_WIDENING = 3
DEFAULT_REPORT = settings.REPO_ROOT / "reports" / "eval.json"


def eval_command(
    planner: Annotated[list[str], typer.Option(
        "--planner", help="A candidate: rules, scripted:<file> or openai[:<model>]; repeat "
        "to compare")],
    evals_dir: Annotated[Path, typer.Option(
        "--evals", help="Directory with manifest.json and its dataset")] = dataset.DEFAULT_DIR,
    report: Annotated[Path, typer.Option(help="Where to write the JSON report")] = DEFAULT_REPORT,
    openai_base_url: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_PLANNER_OPENAI_BASE_URL",
        help="OpenAI-compatible API root for openai candidates")] = "http://127.0.0.1:11434/v1",
    openai_model: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_PLANNER_OPENAI_MODEL", help="Model of an openai candidate "
        "without one")] = "gpt-4o-mini",
    openai_api_key_env: Annotated[str, typer.Option(
        help="Environment variable holding the API key (never passed on the command line)"
    )] = "AGENTLEDGER_PLANNER_OPENAI_API_KEY",
    connectors_url: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_EXECUTOR_CRM_URL",
        help="The connectors' base URL; every connector is replaced by a recording stub, so "
        "nothing is ever sent there")] = "http://127.0.0.1:8090",
    allowlist_path: Annotated[Path | None, typer.Option(
        "--allowlist", help="Allowlist to check against (must be the pinned version)")] = None,
    policies_dir: Annotated[Path | None, typer.Option(
        "--policies", help="Cedar policy directory (must be the pinned version)")] = None,
) -> None:
    """Replay the eval set through retrieval, planning, validation and policy, mutations
    stubbed, and print one column per candidate."""
    try:
        evalset = dataset.load(evals_dir)
        rules = allowlist_mod.Allowlist.load(allowlist_path)
        policy = cedar.CedarPolicy(policies_dir)
        options = runner.OpenAIOptions(openai_base_url, openai_model,
                                       os.environ.get(openai_api_key_env) or None)
        candidates = [runner.candidate(spec, rules, options) for spec in planner]
    except errors.ValidationFailed as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from exc
    pinned = runner.version_problems(evalset, rules, policy)
    if pinned:
        for problem in pinned:
            console.print(f"[red]eval refused[/red]: {problem}", highlight=False)
        console.print("A candidate is judged against the allowlist and policy the eval set pins; "
                      "changing them is never an eval outcome (R9.3).", highlight=False)
        raise typer.Exit(EXIT_WIDENING)
    real = plugins.load(plugins.defaults(connectors_url))
    try:
        runs = asyncio.run(runner.run_all(evalset, candidates, rules=rules, policy=policy,
                                          connectors=real))
    except errors.AgentLedgerError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from exc
    finally:
        asyncio.run(_close(real))
    violations = [v for run in runs for v in run.violations]
    failures = [f"{v.candidate} on {v.case_id}: {v.detail}; passing would need a {v.kind} "
                "change" for v in violations]
    document = scoring.report(evalset, runs, allowlist_version=rules.version,
                              policy_version=policy.version, failures=failures)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    render(evalset, runs, rules.version, policy.version)
    console.print(f"report: {report}", highlight=False)
    if failures:
        for failure in failures:
            console.print(f"[red]scope widening[/red]: {failure}", highlight=False)
        console.print("eval FAILED: a candidate's proposals would need a wider allowlist or a "
                      "looser policy to pass; better prose never justifies that (R9.3).",
                      highlight=False)
        raise typer.Exit(EXIT_WIDENING)


async def _close(connectors: dict[str, Any]) -> None:
    for connector in connectors.values():
        await connector.aclose()


def render(evalset: dataset.EvalSet, runs: list[runner.CandidateRun], allowlist_version: str,
           policy_version: str) -> None:
    """The side-by-side table: one row per score, one column per candidate."""
    table = Table(title=f"eval set {evalset.label}, {len(evalset.cases)} cases",
                  caption=f"allowlist {allowlist_version[:19]}…  policy {policy_version[:25]}…")
    table.add_column("score", overflow="fold")
    scores = [scoring.score(run.results) for run in runs]
    for run in runs:
        table.add_column(run.candidate.label, justify="right", overflow="fold")
    for name, label in scoring.ROWS:
        table.add_row(label, *(scoring.cell(s, name) for s in scores))
    console.print(table)


# The command on its own (its tests invoke it so); the front door mounts ``eval_command``.
app = typer.Typer(add_completion=False)
app.command("eval")(eval_command)
