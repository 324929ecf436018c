"""``agentledger eval``: the side-by-side table, the report, and the refusals (exit codes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentledger.cli import eval as cli_eval
from agentledger.evals import dataset
from agentledger.policy import allowlist

WORSE = "scripted:evals/fixtures/worse.jsonl"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_eval.app, list(args), env={"COLUMNS": "160"})
    return result.exit_code, result.output


def test_rules_against_worse_prints_the_table_and_writes_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(dataset.DEFAULT_DIR.parent)  # the spelling: a repo-relative script
    report = tmp_path / "eval.json"
    code, out = invoke("--planner", "rules", "--planner", WORSE, "--report", str(report))
    assert code == 0, out
    for row in ("action accuracy", "exact-argument accuracy", "refusal precision",
                "refusal recall", "escalation accuracy", "injection cases resisted",
                "tokens used"):
        assert row in out
    assert "rules" in out and "worse.jsonl" in out
    document = json.loads(report.read_text())
    assert document["failed"] is False
    assert [c["label"] for c in document["candidates"]] == ["rules", WORSE]
    rules, worse = (c["scores"] for c in document["candidates"])
    assert worse["cases_correct"]["value"] < rules["cases_correct"]["value"]
    assert document["evalset"]["sha256"] == dataset.load().manifest.sha256


def test_a_modified_allowlist_fails_the_eval(tmp_path: Path) -> None:
    document = json.loads(allowlist.DEFAULT_PATH.read_text())
    document["actions"][2]["arguments"]["properties"]["amount_minor"]["maximum"] = 100_000_000
    wider = tmp_path / "allowlist.json"
    wider.write_text(json.dumps(document))
    code, out = invoke("--planner", "rules", "--allowlist", str(wider),
                       "--report", str(tmp_path / "r.json"))
    assert code == cli_eval.EXIT_WIDENING, out
    assert "eval refused" in out and "allowlist version" in out
    assert not (tmp_path / "r.json").exists()


def test_a_candidate_that_needs_a_wider_scope_fails_the_eval(tmp_path: Path) -> None:
    root = tmp_path / "evals"
    shutil.copytree(dataset.DEFAULT_DIR, root)
    path = root / "dataset.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        case = json.loads(line)
        if case["id"] == "outside-001":
            case["expected"] = {"outcome": "allow", "action": "crm.customers.export_all",
                                "target": "c-1001", "arguments": {"format": "csv"}}
        lines.append(dataset.dumps_case(case) + "\n")
    path.write_text("".join(lines))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["sha256"] = dataset.digest(path)
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "r.json"
    code, out = invoke("--planner", f"scripted:{dataset.DEFAULT_DIR / 'fixtures/worse.jsonl'}",
                       "--evals", str(root), "--report", str(report))
    assert code == cli_eval.EXIT_WIDENING, out
    assert "scope widening" in out and "outside-001" in out and "eval FAILED" in out
    assert json.loads(report.read_text())["failed"] is True


def test_a_dataset_that_does_not_match_its_manifest_is_a_usage_error(tmp_path: Path) -> None:
    root = tmp_path / "evals"
    shutil.copytree(dataset.DEFAULT_DIR, root)
    with (root / "dataset.jsonl").open("a") as f:
        f.write("\n")
    code, out = invoke("--planner", "rules", "--evals", str(root))
    assert code == cli_eval.EXIT_USAGE and "does not match its manifest" in out
