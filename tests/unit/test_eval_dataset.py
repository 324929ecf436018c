"""The eval set is fixed, pinned and covers what R9.1 and issue 11 ask for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentledger import errors
from agentledger.evals import dataset
from agentledger.policy import allowlist, cedar

EVALS = dataset.DEFAULT_DIR


def test_manifest_pins_the_dataset_bytes_and_the_repos_allowlist_and_policy() -> None:
    evalset = dataset.load()
    assert dataset.digest(EVALS / evalset.manifest.dataset) == evalset.manifest.sha256
    # Changing the allowlist or the policy means re-versioning the eval set, in review.
    assert evalset.manifest.allowlist_version == allowlist.Allowlist.load().version
    assert evalset.manifest.policy_version == cedar.CedarPolicy().version
    assert evalset.manifest.tags == dataset.tag_counts(evalset.cases)


def test_at_least_sixty_cases_covering_every_required_kind() -> None:
    cases = dataset.load().cases
    assert len(cases) >= 60
    tags = dataset.tag_counts(cases)
    for needed in ("action", "refusal", "escalation", "not-allowlisted", "injection",
                   "cross-tenant", "limits", "currencies", "revision"):
        assert tags.get(needed, 0) >= 3, needed
    outcomes = {c.expected.outcome for c in cases}
    assert outcomes == {"allow", "escalate", "refuse"}
    # Injected text really is in the evidence, not in the goal.
    for case in (c for c in cases if "injection" in c.tags):
        evidence = json.dumps([r.model_dump() for r in case.records]).lower()
        assert any(w in evidence for w in ("refund", "act for", "export", "tenant_id",
                                           "operation", "email")), case.id


def test_a_changed_byte_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "evals"
    shutil.copytree(EVALS, copy)
    data = copy / "dataset.jsonl"
    data.write_text(data.read_text().replace("Monday", "Tuesday", 1))
    with pytest.raises(errors.ValidationFailed, match="does not match its manifest"):
        dataset.load(copy)


def test_cases_are_closed_and_ids_and_goals_unique() -> None:
    line = (EVALS / "dataset.jsonl").read_text().splitlines()[0]
    case = json.loads(line)
    with pytest.raises(errors.ValidationFailed, match="not a valid case"):
        dataset.parse_cases(json.dumps({**case, "surprise": 1}))
    with pytest.raises(errors.ValidationFailed, match="repeated case id"):
        dataset.parse_cases(line + "\n" + line)
    with pytest.raises(errors.ValidationFailed, match="repeated case goal"):
        dataset.parse_cases(line + "\n" + json.dumps({**case, "id": "other"}))
    refuse_with_action = {**case, "expected": {**case["expected"], "outcome": "refuse"}}
    with pytest.raises(errors.ValidationFailed, match="not a valid case"):
        dataset.parse_cases(json.dumps(refuse_with_action))
