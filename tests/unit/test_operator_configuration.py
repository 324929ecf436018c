"""Outside the demo profile, a service never runs the packaged configuration by accident
(issue 38): it names what to set and stops."""

from __future__ import annotations

import pytest

from agentledger import settings

CONFIG = {"AGENTLEDGER_ALLOWLIST": "/etc/al/allowlist.json",
          "AGENTLEDGER_POLICY_DIR": "/etc/al/policies",
          "AGENTLEDGER_CONNECTORS": '{"crm": {"url": "https://crm.internal"}}'}


def test_nothing_named_is_everything_missing() -> None:
    assert settings.missing_configuration(allowlist=True, policies=True, connectors=True,
                                          environ={}) == list(CONFIG)


def test_each_service_needs_only_what_it_reads() -> None:
    assert settings.missing_configuration(connectors=True, environ={
        "AGENTLEDGER_CONNECTORS": CONFIG["AGENTLEDGER_CONNECTORS"]}) == []
    assert settings.missing_configuration(allowlist=True, policies=True, environ={
        "AGENTLEDGER_ALLOWLIST": "a.json"}) == ["AGENTLEDGER_POLICY_DIR"]


def test_the_demo_profile_runs_the_packaged_configuration_on_purpose() -> None:
    assert settings.missing_configuration(allowlist=True, policies=True, connectors=True,
                                          environ={"AGENTLEDGER_PROFILE": "demo"}) == []
    # Any other profile is no permission.
    assert settings.missing_configuration(connectors=True, environ={
        "AGENTLEDGER_PROFILE": "prod"}) == ["AGENTLEDGER_CONNECTORS"]


def test_a_refusal_is_one_line_naming_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*CONFIG, "AGENTLEDGER_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as stopped:
        settings.require_configuration("reconciler", connectors=True)
    message = str(stopped.value.code)
    assert "\n" not in message and "AGENTLEDGER_CONNECTORS" in message
    assert "AGENTLEDGER_PROFILE=demo" in message
