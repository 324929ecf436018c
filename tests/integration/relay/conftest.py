"""Per test: a fresh database, its own slot and its own topic namespace; all removed after."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from agentledger.testing import ledger
from tests import stack as stack_mod
from tests.integration.relay import support


@pytest.fixture
def relay(
    stack: stack_mod.Stack,
    make_database: Callable[[], str],
    kafka_admin: AdminClient,
    tmp_path: Path,
) -> Iterator[support.Relay]:
    tag = uuid.uuid4().hex[:10]
    runner = support.Relay(
        database_url=make_database(),
        bootstrap=stack.kafka_bootstrap,
        slot=f"relay_test_{tag}",
        namespace=f"rt{tag}.",
        log_dir=tmp_path,
    )
    try:
        yield runner
    finally:
        runner.kill_all()
        ledger.drop_slot(runner.database_url, runner.slot)
        ledger.delete_namespace_topics(kafka_admin, runner.namespace)
