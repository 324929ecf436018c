"""Who may approve or deny: one list of roles, and Cedar asked for denials too."""

from __future__ import annotations

import re
import uuid

import pytest

from agentledger.approvals import rules
from agentledger.policy import cedar

POLICY = cedar.CedarPolicy()
TENANT, OTHER = uuid.uuid4(), uuid.uuid4()


def deny_as(*roles: str, tenant: uuid.UUID = TENANT, revoked: bool = False
            ) -> cedar.CedarDecision:
    denier = cedar.Principal(tenant, "user:bob", frozenset(roles), revoked=revoked)
    return POLICY.may_deny(denier, tenant_id=TENANT, action="billing.refund.create",
                           risk="high", connector="billing", resource_id="cust-1")


def test_the_cedar_permits_name_exactly_the_approving_roles() -> None:
    blocks = POLICY.files["20_approve.cedar"].split("@id(")[1:]
    found = [re.search(r'Action::"(\w+)".*containsAny\(\[([^\]]*)\]\)', b, flags=re.S)
             for b in blocks if "permit" in b]
    permits = [m.groups() for m in found if m is not None]
    assert {q for q, _ in permits} == {"approve", "deny"}
    for _, listed in permits:
        assert set(re.findall(r'"([^"]+)"', listed)) == rules.APPROVING_ROLES


@pytest.mark.parametrize("role", sorted(rules.APPROVING_ROLES))
def test_an_approver_may_deny(role: str) -> None:
    d = deny_as(role)
    assert (d.effect, d.reasons) == ("allow", ("approvers-deny",))
    assert d.policy_version == POLICY.version


@pytest.mark.parametrize("roles", [(), ("user",), ("agent-operator", "auditor")])
def test_a_principal_without_an_approving_role_may_not_deny(roles: tuple[str, ...]) -> None:
    d = deny_as(*roles)
    assert (d.effect, d.reasons) == ("deny", ())
    assert "no approving role" in d.reason


def test_a_revoked_approver_may_not_deny() -> None:
    d = deny_as("approver", revoked=True)
    assert (d.effect, d.reasons) == ("deny", ("revoked-principal",))


def test_an_approver_of_another_tenant_may_not_deny() -> None:
    d = deny_as("finance-approver", tenant=OTHER)
    assert (d.effect, d.reasons) == ("deny", ("tenant-boundary",))
