"""The CRM connectors' declarations and the executor's call bound (issue 18 §1)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from agentledger.connectors import base, crm
from agentledger.executor import dispatcher
from agentledger.ledger import dispatch
from agentledger.services.executor.settings import ExecutorSettings


def test_both_connectors_declare_a_call_bound_from_their_timeouts() -> None:
    # The bound is every phase of one request once: pool 2 + connect 2 + write 5 + read 5.
    assert crm.CALL_TIMEOUT_S == 14.0
    for connector in (crm.CrmConnector, crm.BillingConnector):
        assert connector.contract.call_timeout_s == crm.CALL_TIMEOUT_S <= dispatch.MAX_CALL_S


def test_a_contract_must_declare_a_positive_call_bound() -> None:
    with pytest.raises(TypeError):
        base.Contract("none")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="positive"):
        base.Contract("none", call_timeout_s=0)


def _dispatcher(**overrides: Any) -> dispatcher.Dispatcher:
    fields: dict[str, Any] = {
        "pool": None, "connectors": crm.registry("http://crm.test"),
        "credentials": base.Credentials("write"), "cipher": None, "authorizer": None,
        "allowlist": None, "worker_id": "w", **overrides}
    return dispatcher.Dispatcher(**fields)


def test_the_dispatcher_refuses_a_call_bound_past_the_ledgers_window() -> None:
    assert _dispatcher().call_bound(crm.CrmConnector("http://crm.test")) == crm.CALL_TIMEOUT_S
    assert _dispatcher(call_timeout_s=2.0).call_bound(crm.CrmConnector("http://crm.test")) == 2.0
    with pytest.raises(ValueError, match="MAX_CALL_S"):
        _dispatcher(call_timeout_s=dispatch.MAX_CALL_S + 1)


def test_the_executor_setting_overrides_the_bound_within_the_ledgers_window() -> None:
    required = {"AGENTLEDGER_DATABASE_URL": "postgresql://x", "AGENTLEDGER_KAFKA_BOOTSTRAP": "k:9",
                "AGENTLEDGER_MASTER_KEY": "k"}
    assert ExecutorSettings.model_validate(required).call_timeout_s is None
    assert ExecutorSettings.model_validate(
        {**required, "AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S": "2"}).call_timeout_s == 2.0
    with pytest.raises(pydantic.ValidationError):
        ExecutorSettings.model_validate(
            {**required, "AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S": str(dispatch.MAX_CALL_S + 1)})
