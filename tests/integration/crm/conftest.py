"""The CRM stand-in per test module, built on :mod:`agentledger.testing.crm`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from agentledger.testing.crm import Crm, run_crm


@pytest.fixture(scope="module")
def crm_factory(
    make_database: Callable[[], str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Crm]]:
    """Start CRM processes (each on its own fresh database) that live for the module."""
    log_dir = tmp_path_factory.mktemp("crm")
    with ExitStack() as processes:
        yield lambda **settings: processes.enter_context(
            run_crm(make_database(), log_dir, **settings)
        )


@pytest.fixture(scope="module")
def crm(crm_factory: Callable[..., Crm]) -> Crm:
    """A CRM with fault injection enabled; each test makes its own tenant."""
    return crm_factory(faults_enabled="true")
