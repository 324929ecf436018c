"""The deploy tier: manifests, compose file and image checked offline; Debezium against the stack."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered here rather than in pyproject.toml so this tier stays self-contained.
    config.addinivalue_line(
        "markers", "deploy: checks of the deployment artefacts (Dockerfile, compose, k8s, Debezium)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/deploy/" in str(item.path):
            item.add_marker(pytest.mark.deploy)


# Timings the Debezium test reports (fetch, worker start, streaming), shown after the run.
TIMINGS: list[str] = []
# What `kustomize build` rendered and kubeconform concluded, per overlay, shown after the run.
MANIFEST_RESULTS: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.section("deploy timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)
    if MANIFEST_RESULTS:
        terminalreporter.section("kustomize + kubeconform")
        for line in MANIFEST_RESULTS:
            terminalreporter.write_line(line)
