"""The image's build context holds what the Dockerfile needs, and the wheel built from it
contains every service.

No Docker engine here: the test rebuilds the Dockerfile's wheel step from exactly the files
``.dockerignore`` lets into the context, and checks the final stage's security settings.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("admission", "crm", "executor", "ingress", "planner", "reconciler", "relay")


def _ignore_patterns() -> list[tuple[bool, str]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def _in_context(path: str, rules: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last matching pattern wins; a directory pattern covers its tree."""
    included = True
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for negated, pattern in rules:
        bare = pattern.removeprefix("**/")
        hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes) or (
            pattern.startswith("**/") and any(fnmatch.fnmatchcase(seg, bare) or
                                              fnmatch.fnmatchcase(p, "*/" + bare)
                                              for seg in parts for p in prefixes))
        if hit:
            included = negated
    return included


def _context_files() -> list[str]:
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.splitlines()
    rules = _ignore_patterns()
    return [line.split("\t", 1)[1] for line in tracked
            if _in_context(line.split("\t", 1)[1], rules)]


def test_context_is_small_and_complete() -> None:
    files = _context_files()
    tops = {f.split("/", 1)[0] for f in files}
    assert tops == {"pyproject.toml", "README.md", "libs", "services", "migrations"}
    assert not [f for f in files if f.startswith(("tests/", ".local", "deploy/", "bench/"))]
    assert "libs/agentledger/services" in files  # the link the wheel follows


def test_wheel_from_the_context_holds_every_service(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for name in _context_files():
        source, target = ROOT / name, context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)
    # The Dockerfile's build step, minus the dependencies. Build isolation as in the image:
    # the SPDX license string needs a newer setuptools than some venvs carry.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(tmp_path / "wheels"), str(context)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheels").glob("agentledger-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for service in SERVICES:
        assert f"agentledger/services/{service}/__main__.py" in names, service
        assert f"agentledger/services/{service}/settings.py" in names, service
    assert "agentledger/relay/queries.sql" in names
    assert "agentledger/policy/allowlist.json" in names
    assert "agentledger/services/crm/schema.sql" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_dockerfile_final_stage_is_non_root_and_complete() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [s for s in text.split("\nFROM ")[1:]]
    assert len(stages) == 2 and stages[0].startswith("python:3.11-slim AS build")
    final = stages[-1]
    assert final.startswith("python:3.11-slim")
    assert "USER 10001:10001" in final
    assert "COPY --from=build /opt/agentledger /opt/agentledger" in final
    assert "COPY migrations /app/migrations" in final
    assert "AGENTLEDGER_MIGRATIONS_DIR=/app/migrations" in final
    assert 'CMD ["python", "-m", "agentledger.services.admission"]' in final
    assert "ENTRYPOINT" not in final  # the command alone chooses the service
