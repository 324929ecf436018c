"""The integrator's API is declared (``__all__``), typed (``py.typed``) and cheap to import."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import agentledger
from agentledger import errors

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves() -> None:
    for name in agentledger.__all__:
        assert getattr(agentledger, name) is not None, name
    assert agentledger.GatewayClient.__module__ == "agentledger.client"
    assert agentledger.errors is errors


def test_errors_declare_the_whole_closed_hierarchy() -> None:
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and obj.__module__ == errors.__name__}
    assert set(errors.__all__) == defined
    assert all(issubclass(getattr(errors, name), errors.AgentLedgerError)
               for name in errors.__all__)


def test_the_package_ships_its_type_marker() -> None:
    assert (ROOT / "libs" / "agentledger" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in data["package-data"]["*"]


def test_importing_the_package_does_not_import_the_client() -> None:
    """A service importing ``agentledger.ledger`` must not pay for httpx and Kafka clients."""
    code = ("import sys, agentledger, agentledger.ledger.repository; "
            "print('agentledger.client' in sys.modules, 'httpx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT / "libs")}).stdout.split()
    assert out == ["False", "False"]


def test_unknown_names_are_attribute_errors() -> None:
    try:
        agentledger.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("agentledger.NoSuchThing resolved")
