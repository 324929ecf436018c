"""The Cedar policy: each shipped rule, fail-closed evaluation, and a content-hash version."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from agentledger import errors
from agentledger.policy import allowlist, cedar, decision

ALLOWLIST = allowlist.Allowlist.load()
POLICY = cedar.CedarPolicy()
TENANT = uuid.uuid4()
OTHER_TENANT = uuid.uuid4()
NOTE = ALLOWLIST.get("crm.note.create")
CONTACT = ALLOWLIST.get("crm.contact.update")
REFUND = ALLOWLIST.get("billing.refund.create")


def who(name: str, *roles: str, tenant: uuid.UUID = TENANT, revoked: bool = False) -> cedar.Principal:
    return cedar.Principal(tenant, name, frozenset(roles), revoked=revoked)


def ask(principal: cedar.Principal, action: allowlist.ActionSpec, **kw: object) -> cedar.CedarDecision:
    return POLICY.evaluate(cedar.PolicyRequest(principal, action, "cust-1", **kw))  # type: ignore[arg-type]


def refund(amount: int, requester: cedar.Principal | None = None) -> cedar.PolicyRequest:
    return cedar.PolicyRequest(requester or who("alice", "user"), REFUND, "cust-1",
                               {"amount_minor": amount, "currency": "EUR"})


@pytest.mark.parametrize("role", ["agent-operator", "user"])
def test_low_risk_is_auto_approved_for_operators_and_users(role: str) -> None:
    d = ask(who("alice", role), NOTE)
    assert (d.effect, d.reasons) == ("allow", ("low-risk-auto-approved",))
    assert d.policy_version == POLICY.version


@pytest.mark.parametrize("action", [CONTACT, REFUND], ids=lambda a: a.name)
@pytest.mark.parametrize("role", ["agent-operator", "user"])
def test_medium_and_high_risk_require_approval(role: str, action: allowlist.ActionSpec) -> None:
    d = ask(who("alice", role), action, arguments={"amount_minor": 100})
    assert (d.effect, d.reasons) == ("require_approval", ("operators-may-request",))


@pytest.mark.parametrize("roles", [(), ("auditor",), ("approver",), ("finance-approver",)])
def test_a_principal_without_a_requesting_role_is_denied(roles: tuple[str, ...]) -> None:
    for action in (NOTE, CONTACT, REFUND):
        d = ask(who("mallory", *roles), action)
        assert (d.effect, d.reasons) == ("deny", ()), (roles, action.name)
        assert "no policy permits" in d.reason


def test_a_revoked_principal_is_denied_everything() -> None:
    revoked = who("alice", "user", "agent-operator", "finance-approver", revoked=True)
    for action in (NOTE, CONTACT, REFUND):
        d = ask(revoked, action)
        assert (d.effect, d.reasons) == ("deny", ("revoked-principal",))
    d = POLICY.may_approve(who("bob", "finance-approver", revoked=True), refund(100))
    assert (d.effect, d.reasons) == ("deny", ("revoked-principal",))


def test_a_resource_of_another_tenant_is_denied_whatever_the_roles() -> None:
    d = ask(who("alice", "user", "agent-operator"), NOTE, resource_tenant_id=OTHER_TENANT)
    assert (d.effect, d.reasons) == ("deny", ("tenant-boundary",))
    # The Policy-protocol entry point carries the same check.
    d = POLICY.decide(tenant_id=TENANT, principal_id="alice", action=NOTE, resource_id="cust-1",
                      principal=who("alice", "user"), resource_tenant_id=OTHER_TENANT)
    assert d.effect == "deny"


def test_an_approver_of_another_tenant_cannot_approve() -> None:
    d = POLICY.may_approve(who("bob", "finance-approver", tenant=OTHER_TENANT), refund(100))
    assert (d.effect, d.reasons) == ("deny", ("tenant-boundary",))


@pytest.mark.parametrize(("amount", "role", "effect"), [
    (50_000, "approver", "allow"),            # 500.00 exactly is not "above 500.00"
    (50_001, "approver", "deny"),
    (50_001, "finance-approver", "allow"),
    (1_000_000, "finance-approver", "allow"),
    (100, "finance-approver", "allow"),
])
def test_refunds_above_500_are_approved_by_finance_only(amount: int, role: str, effect: str) -> None:
    d = POLICY.may_approve(who("bob", role), refund(amount))
    assert d.effect == effect
    if effect == "deny":
        assert d.reasons == ("large-refund-needs-finance",)


def test_a_refund_of_unknown_amount_counts_as_large() -> None:
    request = cedar.PolicyRequest(who("alice", "user"), REFUND, "cust-1", {})
    assert POLICY.may_approve(who("bob", "approver"), request).effect == "deny"
    assert POLICY.may_approve(who("carol", "finance-approver"), request).effect == "allow"


def test_nobody_approves_their_own_request() -> None:
    alice = who("alice", "user", "finance-approver")
    d = POLICY.may_approve(alice, refund(100, requester=alice))
    assert (d.effect, d.reasons) == ("deny", ("no-self-approval",))
    # Same principal id in another tenant is another principal (and another tenant: denied).
    assert POLICY.may_approve(who("alice", "approver"), cedar.PolicyRequest(
        who("alice", "user"), CONTACT, "cust-1")).effect == "deny"
    assert POLICY.may_approve(who("bob", "approver"), cedar.PolicyRequest(
        who("alice", "user"), CONTACT, "cust-1")).effect == "allow"


def test_a_role_without_approving_rights_cannot_approve() -> None:
    d = POLICY.may_approve(who("bob", "user", "agent-operator"), refund(100))
    assert (d.effect, d.reasons) == ("deny", ())


def test_an_evaluation_error_denies() -> None:
    # An amount Cedar cannot represent (beyond 64 bits) makes the request fail to build; a
    # skipped forbid must never fail open.
    d = ask(who("alice", "user"), REFUND, arguments={"amount_minor": 2**70})
    assert d.effect == "deny" and "evaluation failed" in d.reason


def test_odd_principal_and_resource_ids_are_data_not_syntax() -> None:
    d = POLICY.evaluate(cedar.PolicyRequest(who('a"b\n::"x', "user"), NOTE, 'c"; permit'))
    assert d.effect == "allow"


def test_decide_without_a_principal_record_denies_and_matches_the_protocol() -> None:
    policy: decision.Policy = POLICY
    d = policy.decide(tenant_id=TENANT, principal_id="alice", action=NOTE, resource_id="cust-1")
    assert d.effect == "deny"
    # A principal record for someone else is refused rather than trusted.
    d = POLICY.decide(tenant_id=TENANT, principal_id="alice", action=NOTE, resource_id="cust-1",
                      principal=who("bob", "user"))
    assert d.effect == "deny"


async def test_authorize_reads_the_directory_at_each_call() -> None:
    directory = cedar.InMemoryPrincipalDirectory()
    kw = {"tenant_id": TENANT, "principal_id": "alice", "action": NOTE, "resource_id": "cust-1"}
    assert (await POLICY.authorize(directory, **kw)).effect == "deny"  # type: ignore[arg-type]
    directory.put(who("alice", "user"))
    assert (await POLICY.authorize(directory, **kw)).effect == "allow"  # type: ignore[arg-type]
    directory.revoke(TENANT, "alice")
    assert (await POLICY.authorize(directory, **kw)).effect == "deny"  # type: ignore[arg-type]


def test_each_decision_has_its_own_id() -> None:
    ids = {ask(who("alice", "user"), NOTE).decision_id for _ in range(5)}
    assert len(ids) == 5


# ------------------------------------------------------------------------------ version


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(cedar.DEFAULT_DIR, target)
    return target


def test_version_is_a_stable_content_hash(tmp_path: Path) -> None:
    assert re.fullmatch(r"cedar/sha256:[0-9a-f]{64}", POLICY.version)
    assert cedar.CedarPolicy().version == POLICY.version
    assert cedar.CedarPolicy(_copy(tmp_path)).version == POLICY.version


def test_any_policy_or_schema_change_changes_the_version(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    request = (d / "10_request.cedar")
    request.write_text(request.read_text().replace('"user"]', '"intern"]'))
    changed = cedar.CedarPolicy(d)
    assert changed.version != POLICY.version
    assert changed.evaluate(cedar.PolicyRequest(who("i", "intern"), NOTE, "c")).effect == "allow"

    d2 = _copy(tmp_path / "b")
    (d2 / "schema.cedarschema.json").write_text((d2 / "schema.cedarschema.json").read_text() + "\n")
    assert cedar.CedarPolicy(d2).version != POLICY.version

    d3 = _copy(tmp_path / "c")
    (d3 / "30_extra.cedar").write_text(
        '@id("extra")\nforbid (principal, action, resource) when { principal.roles.contains("x") };\n')
    assert cedar.CedarPolicy(d3).version != POLICY.version


@pytest.mark.parametrize(("name", "text", "match"), [
    ("30_bad.cedar", "permit (principal, action, resource) when { principal.nope };", "unique @id"),
    ("30_bad.cedar", '@id("x")\npermit (principal, action, resource) when { principal.nope };',
     "do not match the schema"),
    ("30_bad.cedar", '@id("revoked-principal")\npermit (principal, action, resource);', "unique @id"),
    ("30_bad.cedar", "this is not cedar", "Cedar policies"),
])
def test_malformed_policy_sets_are_refused(tmp_path: Path, name: str, text: str, match: str) -> None:
    d = _copy(tmp_path)
    (d / name).write_text(text)
    with pytest.raises(errors.ValidationFailed, match=match):
        cedar.CedarPolicy(d)


def test_a_directory_without_policies_or_schema_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.ValidationFailed):
        cedar.CedarPolicy(tmp_path)
    d = _copy(tmp_path)
    (d / cedar.SCHEMA_FILE).unlink()
    with pytest.raises(errors.ValidationFailed, match="unreadable"):
        cedar.CedarPolicy(d)
