"""The eval set: fixed cases in JSONL, pinned by a manifest (R9.1).

The manifest records the dataset's SHA-256 and the allowlist and Cedar policy versions the
expected answers were written against. A dataset whose bytes do not match its manifest is
refused, so "the same eval set" always means the same bytes.

A case holds everything a replay needs and nothing live: the goal and resource hint, the
tenant and principal (by name; ids are derived), the CRM records each tenant's retrieval
would see, and the expected result: an action with exact arguments (auto-approved or
escalated to a person) or a refusal.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import pydantic
from pydantic import ConfigDict, Field, StringConstraints

from agentledger import errors, settings
from agentledger.contracts import requests

DEFAULT_DIR: Final = settings.REPO_ROOT / "evals"
MANIFEST_FORMAT: Final = "agentledger.evalset.v1"
# Tenant and principal names map to stable ids, so a case replays identically everywhere.
_NAMESPACE: Final = uuid.UUID("6f1d3a52-8c0e-5b7a-9d24-31c8e0a4b9f7")

Name = Annotated[str, StringConstraints(min_length=1, max_length=64,
                                        pattern=r"^[A-Za-z0-9][A-Za-z0-9_:.@-]*$")]
Outcome = Literal["allow", "escalate", "refuse"]


class _Closed(pydantic.BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Note(_Closed):
    note_id: Name
    body: Annotated[str, StringConstraints(max_length=4000)]


class Document(_Closed):
    document_id: Name
    title: Annotated[str, StringConstraints(max_length=200)]
    text: Annotated[str, StringConstraints(max_length=4000)]


class Record(_Closed):
    """One CRM customer as a tenant's READ-only retrieval would see it.

    Attributes:
        current_revision: The revision admission's resolver finds, when the record changed
            after retrieval read it (a stale-revision case); ``revision`` otherwise.
        notes, documents: ``None`` when the CRM does not offer that collection (404).
    """

    tenant: Name
    customer_id: Name
    revision: Annotated[int, Field(ge=1, le=1_000_000)]
    current_revision: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    fields: dict[str, str] = Field(default_factory=dict)
    notes: list[Note] | None = None
    documents: list[Document] | None = None


class Principal(_Closed):
    id: Name
    roles: list[Name] = Field(default_factory=list)
    revoked: bool = False


class Expected(_Closed):
    """The right answer.

    Attributes:
        outcome: ``allow`` (auto-approved, would be dispatched), ``escalate`` (would wait for
            a person) or ``refuse`` (nothing would be admitted).
        loose: Argument names compared for presence only (free text such as a refund's
            reason, which a planner may word as it likes); every other argument is exact.
        why: For refusals, what the runtime or planner should recognise (documentation).
    """

    outcome: Outcome
    action: Name | None = None
    target: Name | None = None
    arguments: dict[str, Any] | None = None
    loose: list[Name] = Field(default_factory=list)
    why: Annotated[str, StringConstraints(max_length=300)] | None = None

    @pydantic.model_validator(mode="after")
    def _complete(self) -> Expected:
        acting = self.outcome != "refuse"
        if acting != (self.action is not None and self.target is not None
                      and self.arguments is not None):
            raise ValueError("allow/escalate need action, target and arguments; refuse none")
        return self


class Case(_Closed):
    id: Name
    tags: list[Name] = Field(min_length=1)
    goal: requests.Goal
    tenant: Name
    principal: Principal
    resource: Name
    records: list[Record] = Field(default_factory=list)
    expected: Expected

    @property
    def tenant_id(self) -> uuid.UUID:
        return tenant_id(self.tenant)

    def ids(self) -> tuple[uuid.UUID, uuid.UUID]:
        """The case's (request id, operation id): derived, so every replay uses the same."""
        return (uuid.uuid5(_NAMESPACE, f"request/{self.id}"),
                uuid.uuid5(_NAMESPACE, f"operation/{self.id}"))


def tenant_id(name: str) -> uuid.UUID:
    """The tenant id of a tenant name in the eval set."""
    return uuid.uuid5(_NAMESPACE, f"tenant/{name}")


class Manifest(_Closed):
    format: Literal["agentledger.evalset.v1"]
    name: Name
    version: Name
    dataset: Name
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    cases: int
    allowlist_version: str
    policy_version: str
    tags: dict[str, int] = Field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class EvalSet:
    """A loaded, hash-checked eval set."""

    manifest: Manifest
    cases: tuple[Case, ...]

    @property
    def label(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version} (sha256:{self.manifest.sha256[:12]})"


def digest(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_cases(text: str, *, source: str = "<dataset>") -> list[Case]:
    """Parse JSONL cases; ids and goals must be unique (scripted outputs are keyed by goal).

    Raises:
        errors.ValidationFailed: A line is not a valid case, or an id or goal repeats.
    """
    cases: list[Case] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            cases.append(Case.model_validate_json(line))
        except pydantic.ValidationError as exc:
            raise errors.ValidationFailed(f"{source}:{number}: not a valid case: {exc}") from exc
    for what, values in (("id", [c.id for c in cases]), ("goal", [c.goal for c in cases])):
        repeated = [v for v, n in Counter(values).items() if n > 1]
        if repeated:
            raise errors.ValidationFailed(f"{source}: repeated case {what}: {repeated[0][:80]!r}")
    return cases


def load(directory: Path | str | None = None) -> EvalSet:
    """Load ``manifest.json`` and its dataset from ``directory`` (default: the repo's evals/).

    Raises:
        errors.ValidationFailed: The manifest is malformed, the dataset's SHA-256 or case
            count differs from the manifest's, or a case is invalid.
    """
    root = Path(directory) if directory is not None else DEFAULT_DIR
    try:
        manifest = Manifest.model_validate_json((root / "manifest.json").read_bytes())
    except (OSError, pydantic.ValidationError) as exc:
        raise errors.ValidationFailed(f"eval manifest in {root} unreadable: {exc}") from exc
    path = root / manifest.dataset
    found = digest(path)
    if found != manifest.sha256:
        raise errors.ValidationFailed(
            f"{path} does not match its manifest (sha256 {found[:12]}…, manifest says "
            f"{manifest.sha256[:12]}…): an eval set changes only with a new manifest version")
    cases = parse_cases(path.read_text(encoding="utf-8"), source=str(path))
    if len(cases) != manifest.cases:
        raise errors.ValidationFailed(f"{path}: {len(cases)} cases, manifest says {manifest.cases}")
    return EvalSet(manifest, tuple(cases))


def tag_counts(cases: Sequence[Case]) -> dict[str, int]:
    """How many cases carry each tag, by tag name."""
    return dict(sorted(Counter(t for c in cases for t in c.tags).items()))


def manifest_for(cases: Sequence[Case], dataset_path: Path, *, name: str, version: str,
                 allowlist_version: str, policy_version: str,
                 description: str = "") -> dict[str, Any]:
    """The manifest document of a dataset file (for writing a new version of the set)."""
    return Manifest(
        format=MANIFEST_FORMAT, name=name, version=version, dataset=dataset_path.name,
        sha256=digest(dataset_path), cases=len(cases), allowlist_version=allowlist_version,
        policy_version=policy_version, tags=tag_counts(cases), description=description,
    ).model_dump()


def dumps_case(case: Mapping[str, Any]) -> str:
    """One case as its JSONL line (stable key order, UTF-8)."""
    return json.dumps(case, ensure_ascii=False, sort_keys=True)
