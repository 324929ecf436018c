"""Operator sessions and the provider check of a resolution, without I/O (issue 18 §3).

The integration tier drives both through the CLI on a real ledger and CRM
(tests/integration/test_resolution.py); here, the corners a real provider cannot be put in
cheaply: a key past its retention, a connector that is not installed, no lookup credential.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentledger import errors, identity, operators
from agentledger.connectors import base
from agentledger.executor import resolution

PRIVATE, PUBLIC = identity.generate_keypair("EdDSA")
CFG = operators.OperatorSettings(session_keys={"idp": PUBLIC}, session_issuer="idp")
TENANT = uuid.uuid4()


def token(roles: list[str], tenant: uuid.UUID = TENANT, private: str = PRIVATE) -> str:
    return identity.issue_session(private, "idp", tenant_id=tenant, subject="ops:olga",
                                  audience=CFG.session_audience, issuer="idp", roles=roles)


def test_an_operators_session_verifies() -> None:
    session = operators.verify(token(["agent-operator"]), CFG, tenant_id=TENANT)
    assert (session.tenant_id, session.principal_id) == (TENANT, "ops:olga")


@pytest.mark.parametrize(("make", "cfg", "error"), [
    (lambda: token(["agent-operator"]), operators.OperatorSettings(session_keys={}, session_issuer=""),
     errors.IdentityRejected),
    (lambda: "", CFG, errors.IdentityRejected),
    (lambda: token(["agent-operator"], private=identity.generate_keypair()[0]), CFG,
     errors.IdentityRejected),
    (lambda: token(["user", "approver"]), CFG, errors.NotAnOperator),
], ids=["no-keys-configured", "no-token", "forged", "claims-no-operating-role"])
def test_a_session_that_is_not_an_operators_is_refused(
    make: Any, cfg: operators.OperatorSettings, error: type[errors.AgentLedgerError],
) -> None:
    with pytest.raises(error):
        operators.verify(make(), cfg)


def test_a_session_of_another_tenant_than_named_is_refused() -> None:
    with pytest.raises(errors.IdentityRejected, match="another tenant"):
        operators.verify(token(["agent-operator"]), CFG, tenant_id=uuid.uuid4())


@dataclass
class Provider:
    """A connector whose lookup answers ``found``."""

    found: base.Lookup
    contract: base.Contract = field(
        default_factory=lambda: base.Contract("keyed", lookup=True, retention=timedelta(hours=1),
                                              call_timeout_s=5.0))
    name: str = "crm"
    actions: frozenset[str] = frozenset({"crm.note.create"})
    scopes: frozenset[base.Scope] = frozenset({"lookup"})
    asked: list[base.Call] = field(default_factory=list)

    async def execute(self, call: base.Call, token: str) -> base.Result:
        raise AssertionError("a resolution never writes")

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        self.asked.append(call)
        return self.found

    async def aclose(self) -> None:
        return None


OP = uuid.uuid4()
ROW = {"tenant_id": TENANT, "operation_id": OP, "connector": "crm", "action": "crm.note.create",
       "resource_id": "c-1", "expected_revision": None}
CREDENTIALS = base.Credentials("lookup", {"crm": {str(TENANT): "lookup-token"}})
NOW = datetime(2025, 1, 1, 12, tzinfo=UTC)


def sent(ago: timedelta) -> list[dict[str, Any]]:
    return [{"sent_at": NOW - ago, "fencing_generation": 1, "kind": "dispatch"}]


async def check(provider: Provider | None, outcome: resolution.Outcome = "succeeded",
                receipt: str | None = "crm:note:1", *, ago: timedelta = timedelta(minutes=5),
                allow_unchecked: bool = False, credentials: base.Credentials = CREDENTIALS,
                ) -> resolution.Checked:
    return await resolution.check(provider, credentials, ROW, sent(ago), outcome=outcome,
                                  receipt=receipt, allow_unchecked=allow_unchecked, now=NOW)


async def test_the_lookup_is_asked_by_the_commands_key_with_the_lookup_credential() -> None:
    provider = Provider(base.Applied("crm:note:1"))
    assert (await check(provider)).check == "confirmed"
    assert [c.idempotency_key for c in provider.asked] == [str(OP)]


async def test_a_key_past_the_providers_retention_proves_nothing_so_it_is_not_confirmed() -> None:
    # Inside the window "not found" proves the failure; past it, the provider may have forgotten.
    inside = await check(Provider(base.NotFound()), "failed", None)
    assert inside.check == "confirmed"
    with pytest.raises(errors.ReceiptUnverifiable, match="proves nothing"):
        await check(Provider(base.NotFound()), "failed", None, ago=timedelta(hours=2))
    past = await check(Provider(base.NotFound()), "succeeded", ago=timedelta(hours=2),
                       allow_unchecked=True)
    assert past.check == "unchecked" and "key retention" in past.detail


async def test_a_found_effect_still_contradicts_a_wrong_receipt_past_the_retention() -> None:
    with pytest.raises(errors.ReceiptContradicted):
        await check(Provider(base.Applied("crm:note:2")), ago=timedelta(hours=2),
                    allow_unchecked=True)


@pytest.mark.parametrize(("provider", "credentials"), [
    (None, CREDENTIALS),
    (Provider(base.Applied("crm:note:1")), base.Credentials("lookup", {})),
], ids=["connector-not-installed", "no-lookup-credential"])
async def test_a_lookup_that_cannot_be_asked_refuses_unless_recorded_unchecked(
    provider: Provider | None, credentials: base.Credentials,
) -> None:
    with pytest.raises(errors.ReceiptUnverifiable):
        await check(provider, credentials=credentials)
    recorded = await check(provider, credentials=credentials, allow_unchecked=True)
    assert recorded.check == "unchecked" and recorded.detail.startswith("recorded unchecked")
    if provider is not None:
        assert provider.asked == []


async def test_a_connector_without_lookup_is_unchecked_without_asking() -> None:
    provider = Provider(base.Applied("x"), contract=base.Contract("none", call_timeout_s=5.0))
    found = await check(provider)
    assert found.check == "unchecked" and "declares no lookup" in found.detail
    assert provider.asked == []
