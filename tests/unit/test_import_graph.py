"""The import graph runs one way: services → library, tests/bench/demo → library, never back.

Read from the source (ast), so it checks every import a module can make, at the top or inside
a function, except those under ``if TYPE_CHECKING:`` (which never run):

- no cycle among the library's and the services' modules;
- the library never imports a service, ``tests``, ``bench``, the demo or ``agentledger.testing``
  (the support kit tests, bench and demo share; the runtime must not depend on it);
- a service never imports another service, nor ``tests``, ``bench``, the demo or the kit;
- ``agentledger.testing``, ``bench`` and the demo never import ``tests``.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "libs" / "agentledger"
SERVICES = ROOT / "services"
FOREIGN = ("tests", "bench", "demo")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def package(self) -> bool:
        return self.path.name == "__init__.py"


def _name(path: Path, root: Path, prefix: tuple[str, ...]) -> str:
    parts = [*prefix, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in LIB.rglob("*.py"):
        if path.relative_to(LIB).parts[0] != "services":  # the link to services/, read below
            found[_name(path, LIB.parent, ())] = Module(_name(path, LIB.parent, ()), path)
    for path in SERVICES.rglob("*.py"):
        name = _name(path, SERVICES, ("agentledger", "services"))
        found[name] = Module(name, path)
    return found


def _tree(root: Path) -> Iterator[tuple[str, Path]]:
    for path in root.rglob("*.py"):
        yield _name(path, root.parent, ()), path


class _Imports(ast.NodeVisitor):
    """Every module a file imports, resolved to a module where the name is one."""

    def __init__(self, module: str, package: bool, known: set[str]) -> None:
        self.module, self.package, self.known = module, package, known
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == \
                "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")[: None if self.package else -1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:
            child = f"{source}.{alias.name}"
            self.found.add(child if child in self.known else source)


def _imports(name: str, path: Path, package: bool, known: set[str]) -> set[str]:
    visitor = _Imports(name, package, known)
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


def _under(name: str, *roots: str) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in roots)


def _service(name: str) -> str | None:
    """The service a module belongs to; ``""`` for the shells' shared ``services`` package."""
    parts = name.split(".")
    if parts[:2] == ["agentledger", "services"]:
        return parts[2] if len(parts) > 2 else ""
    if parts[0] == "services":
        return parts[1] if len(parts) > 1 else ""
    return None


def _library_violations(name: str, deps: set[str]) -> list[str]:
    """What a library module may not import: any service (or the shells' shared package),
    test support, bench, the demo."""
    return sorted(dep for dep in deps if _service(dep) is not None
                  or _under(dep, "agentledger.testing", *FOREIGN))


def _service_violations(name: str, deps: set[str]) -> list[str]:
    """What a service may not import: another service, test support, bench, the demo. The
    shells' shared package (``agentledger.services``) is theirs to use."""
    own = _service(name)
    return sorted(dep for dep in deps if _service(dep) not in (None, "", own)
                  or _under(dep, "agentledger.testing", *FOREIGN))


MODULES = _modules()
KNOWN = set(MODULES)
GRAPH = {m.name: _imports(m.name, m.path, m.package, KNOWN) for m in MODULES.values()}


def test_the_graph_reads_the_whole_tree() -> None:
    """A checker that found nothing would pass every rule: it must see the real modules."""
    assert {"agentledger.admission", "agentledger.ledger.repository", "agentledger.cli",
            "agentledger.services.admission.app", "agentledger.services.console.app"} <= KNOWN
    assert "agentledger.ledger.repository" in GRAPH["agentledger.admission.admitter"]
    assert len(KNOWN) > 150


def test_no_cycle() -> None:
    graph = {name: {dep for dep in deps if dep in KNOWN and dep != name}
             for name, deps in GRAPH.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' → '.join(cycle.args[1])}")


def test_the_library_imports_no_service_test_bench_demo_or_kit() -> None:
    bad = {name: _library_violations(name, deps) for name, deps in GRAPH.items()
           if _service(name) is None and not _under(name, "agentledger.testing")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_service_imports_another_or_test_support() -> None:
    bad = {name: _service_violations(name, deps) for name, deps in GRAPH.items()
           if _service(name) is not None}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("root", ["libs/agentledger/testing", "bench", "demo"])
def test_shared_support_does_not_reach_into_tests(root: str) -> None:
    folder = ROOT / root
    if not folder.is_dir():
        pytest.fail(f"{root} is missing")
    bad = {}
    for name, path in _tree(folder):
        deps = _imports(name, path, path.name == "__init__.py", KNOWN)
        if hits := sorted(dep for dep in deps if _under(dep, "tests")):
            bad[name] = hits
    assert bad == {}


def test_the_checker_sees_a_backward_import(tmp_path: Path) -> None:
    """The rules fire on planted violations (so an empty answer above means something)."""
    planted = tmp_path / "planted.py"
    planted.write_text("from agentledger import services\n"
                       "from agentledger.services.admission import app\n"
                       "def f():\n    from tests import helpers\n"
                       "from typing import TYPE_CHECKING\n"
                       "if TYPE_CHECKING:\n    import bench\n")
    deps = _imports("agentledger.planted", planted, False, KNOWN)
    assert {"agentledger.services", "agentledger.services.admission.app", "tests"} <= deps
    assert "bench" not in deps  # under TYPE_CHECKING: never runs
    assert _library_violations("agentledger.planted", deps) == [
        "agentledger.services", "agentledger.services.admission.app", "tests"]
    # A service may use the shells' shared package, not another service.
    assert _service_violations("agentledger.services.executor.app", deps) == [
        "agentledger.services.admission.app", "tests"]
    assert _service_violations("agentledger.services.admission.handlers", deps) == ["tests"]
