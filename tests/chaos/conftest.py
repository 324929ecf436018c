"""The chaos tier: real processes, SIGKILLed at named fault points (see harness.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import pytest

from agentledger.testing.pipeline import Pipeline, pipeline
from tests.chaos import harness
from tests.stack import Stack
from tests.standby import standby_pair  # noqa: F401 - a fixture of the standby cases

# `make chaos` sets it: the production-shaped cases too, beside the subset `make test` runs.
FULL = os.environ.get("AGENTLEDGER_CHAOS_FULL") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chaos/" in str(item.path):
            item.add_marker(pytest.mark.chaos)
        if not FULL and item.get_closest_marker("chaos_full"):
            item.add_marker(pytest.mark.skip(reason="a `make chaos` case (AGENTLEDGER_CHAOS_FULL=1)"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if harness.REPORT.exists():
        data = json.loads(harness.REPORT.read_text())
        terminalreporter.write_sep("=", f"chaos report ({harness.REPORT.relative_to(harness.ROOT)})")
        terminalreporter.write_line(harness.table(data))


@pytest.fixture(scope="module")
def chaos(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("chaos"), env=harness.CHAOS_ENV) as p:
        yield p
