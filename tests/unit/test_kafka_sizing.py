"""Every topic the project creates is sized by one setting, and every producer waits for the
in-sync replicas (issue 19 §2): the rules, the settings that carry them, and the producers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentledger import settings
from agentledger.kafka import batch, topics
from agentledger.services.admission.settings import AdmissionSettings
from agentledger.services.executor.settings import ExecutorSettings
from agentledger.services.ingress.settings import IngressSettings
from agentledger.services.planner.settings import PlannerSettings
from agentledger.services.relay import settings as relay_settings

ROOT = settings.REPO_ROOT
REQUIRED = {"AGENTLEDGER_DATABASE_URL": "postgresql://u:p@127.0.0.1:1/db",
            "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:1", "AGENTLEDGER_MASTER_KEY": "x" * 44}


@pytest.mark.parametrize(("replication", "floor"), [(1, None), (2, None), (3, 2), (4, 3), (5, 3)])
def test_min_insync_replicas_is_a_majority_from_three_replicas(replication: int,
                                                                 floor: int | None) -> None:
    assert topics.min_insync_replicas(replication) == floor


def test_a_created_topic_carries_its_own_min_insync_replicas() -> None:
    sized = topics.new_topic("exec.crm.v1", 12, 3)
    assert (sized.topic, sized.num_partitions, sized.replication_factor) == ("exec.crm.v1", 12, 3)
    assert sized.config == {"min.insync.replicas": "2"}
    assert topics.new_topic("dev", 3, 1).config == {}  # one broker: the broker's default


@pytest.mark.parametrize("cls", [AdmissionSettings, ExecutorSettings, IngressSettings,
                                 PlannerSettings])
def test_every_topic_creating_service_reads_the_shared_replication_factor(cls: type) -> None:
    field = cls.model_fields["kafka_replication_factor"]  # type: ignore[attr-defined]
    assert (field.validation_alias, field.default) == ("AGENTLEDGER_KAFKA_REPLICATION_FACTOR", 1)


def test_a_service_reads_the_replication_factor_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    assert AdmissionSettings.model_validate({}).kafka_replication_factor == 1
    monkeypatch.setenv("AGENTLEDGER_KAFKA_REPLICATION_FACTOR", "3")
    assert AdmissionSettings.model_validate({}).kafka_replication_factor == 3
    monkeypatch.setenv("AGENTLEDGER_KAFKA_REPLICATION_FACTOR", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        AdmissionSettings.model_validate({})


def test_the_relay_takes_the_shared_replication_factor_unless_it_has_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_REPLICATION_FACTOR", "3")
    assert relay_settings.load().relay_options(settings.load()).replication_factor == 3
    monkeypatch.setenv("AGENTLEDGER_RELAY_REPLICATION_FACTOR", "2")
    assert relay_settings.load().relay_options(settings.load()).replication_factor == 2


def _calls(name: str) -> list[tuple[Path, ast.Call]]:
    found = []
    for root in ("libs", "services"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and (
                        getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name):
                    found.append((path, node))
    return found


def test_every_faststream_broker_produces_with_acks_all_and_idempotence() -> None:
    brokers = _calls("KafkaBroker")
    assert len(brokers) >= 2, brokers  # ingress, planner (admission, executors: batch runner)
    for path, call in brokers:
        kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords
              if k.arg in ("acks", "enable_idempotence")}
        assert kw == {"acks": "all", "enable_idempotence": True}, f"{path}:{call.lineno}"


def test_every_confluent_producer_config_has_acks_all_and_idempotence() -> None:
    producers = _calls("Producer")
    assert len(producers) >= 5, producers  # relay, client, demo, admission, executor
    for path, call in producers:
        config = _config_literal(path, call)
        assert (config.get("acks"), config.get("enable.idempotence")) == ("all", True), (
            f"{path}:{call.lineno}")


def _config_literal(path: Path, call: ast.Call) -> dict[str, object]:
    """The producer's config dict: the literal passed, or the literal assigned to the name passed."""
    arg = call.args[0]
    if isinstance(arg, ast.Dict):
        return _literal_keys(arg)
    if isinstance(arg, ast.Call) and ast.unparse(arg.func) == "batch.producer_config":
        return batch.producer_config("x:9092", client_id="x")  # the batch runner's producers
    name = ast.unparse(arg)  # e.g. self._config, assigned once as a dict literal
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t) == name for t in targets):
                return _literal_keys(node.value)
    raise AssertionError(f"{path}:{call.lineno}: producer config {name} is not a dict literal")


def _literal_keys(node: ast.Dict) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
            out[str(key.value)] = value.value
    return out
