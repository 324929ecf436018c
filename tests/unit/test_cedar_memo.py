"""The memo of Cedar answers (issue 41): a hit is the decision Cedar would make, anything
Cedar sees changed is decided afresh, errors are never memoised, and the memo is bounded.

Each test makes its own policy instance (the memo is per instance) and reads its counts: a
"decided afresh" claim is a miss counted, not only the right effect.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cedarpy
import pydantic
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from agentledger.policy import allowlist, cedar, memo

ALLOWLIST = allowlist.Allowlist.load()
TENANT = uuid.uuid4()
OTHER_TENANT = uuid.uuid4()
NOTE = ALLOWLIST.get("crm.note.create")
CONTACT = ALLOWLIST.get("crm.contact.update")
REFUND = ALLOWLIST.get("billing.refund.create")


def who(name: str, *roles: str, tenant: uuid.UUID = TENANT, revoked: bool = False
        ) -> cedar.Principal:
    return cedar.Principal(tenant, name, frozenset(roles), revoked=revoked)


def fields(d: cedar.CedarDecision) -> tuple[str, str, str, tuple[str, ...]]:
    return (d.effect, d.policy_version, d.reason, d.reasons)


def stats_after(policy: cedar.CedarPolicy, call: Callable[[], cedar.CedarDecision]
                ) -> tuple[cedar.CedarDecision, int, int]:
    """The decision, and the hits and misses it added."""
    before = policy.memo_stats()
    d = call()
    after = policy.memo_stats()
    return d, after.hits - before.hits, after.misses - before.misses


def refund(amount: int, requester: cedar.Principal | None = None) -> cedar.PolicyRequest:
    return cedar.PolicyRequest(requester or who("alice", "user"), REFUND, "cust-1",
                               {"amount_minor": amount, "currency": "EUR"})


# Every kind of question, every effect: allow, require_approval, deny (no role, revoked,
# another tenant), approve (allowed, self, large refund), deny (refusal) questions.
def _questions(policy: cedar.CedarPolicy) -> list[Callable[[], cedar.CedarDecision]]:
    alice, bob = who("alice", "user"), who("bob", "approver")
    return [
        lambda: policy.evaluate(cedar.PolicyRequest(alice, NOTE, "cust-1")),
        lambda: policy.evaluate(cedar.PolicyRequest(alice, CONTACT, "cust-1")),
        lambda: policy.evaluate(cedar.PolicyRequest(who("mallory"), NOTE, "cust-1")),
        lambda: policy.evaluate(cedar.PolicyRequest(who("eve", "user", revoked=True), NOTE,
                                                    "cust-1")),
        lambda: policy.evaluate(cedar.PolicyRequest(alice, NOTE, "cust-1",
                                                    resource_tenant_id=OTHER_TENANT)),
        lambda: policy.may_approve(bob, refund(100)),
        lambda: policy.may_approve(bob, refund(60_000)),
        lambda: policy.may_approve(bob, refund(100, requester=who("bob", "approver", "user"))),
        lambda: policy.may_deny(bob, tenant_id=TENANT, action="crm.contact.update",
                                risk="medium", connector="crm", resource_id="cust-1"),
    ]


def test_a_hit_is_the_decision_cedar_makes_without_the_memo() -> None:
    memoised, plain = cedar.CedarPolicy(memo_size=64), cedar.CedarPolicy(memo_size=0)
    for ask, ask_plain in zip(_questions(memoised), _questions(plain), strict=True):
        cold, hits, misses = stats_after(memoised, ask)
        assert (hits, misses) == (0, 1)
        warm, hits, misses = stats_after(memoised, ask)
        assert (hits, misses) == (1, 0), cold.reason
        assert fields(warm) == fields(cold) == fields(ask_plain())
    assert {d().effect for d in _questions(memoised)} == {"allow", "require_approval", "deny"}
    # The memo off: every decision put to Cedar, nothing held.
    assert plain.memo_stats() == memo.MemoStats(0, 9, 0, 0)


def test_a_revocation_read_now_is_decided_afresh() -> None:
    policy = cedar.CedarPolicy(memo_size=64)

    def authorize(found: cedar.Principal) -> cedar.CedarDecision:
        return policy.authorize_found(found, tenant_id=TENANT, principal_id="alice",
                                      action=NOTE, resource_id="cust-1")

    assert authorize(who("alice", "user")).effect == "allow"
    assert stats_after(policy, lambda: authorize(who("alice", "user")))[1:] == (1, 0)
    d, hits, misses = stats_after(policy, lambda: authorize(who("alice", "user", revoked=True)))
    assert (d.effect, d.reasons, hits, misses) == ("deny", ("revoked-principal",), 0, 1)
    d, hits, misses = stats_after(policy, lambda: authorize(who("alice", "user", revoked=True)))
    assert (d.effect, d.reasons, hits, misses) == ("deny", ("revoked-principal",), 1, 0)


async def test_authorize_reads_the_directory_at_every_evaluation() -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    directory = cedar.InMemoryPrincipalDirectory()
    directory.put(who("alice", "user", "agent-operator"))

    async def authorize() -> cedar.CedarDecision:
        return await policy.authorize(directory, tenant_id=TENANT, principal_id="alice",
                                      action=NOTE, resource_id="cust-1")

    assert (await authorize()).effect == "allow"
    assert (await authorize()).effect == "allow"
    assert policy.memo_stats()[:2] == (1, 1)
    directory.put(who("alice", "agent-operator"))  # a role removed, one left: same answer
    assert (await authorize()).effect == "allow"
    directory.put(who("alice"))  # every requesting role removed
    d = await authorize()
    assert (d.effect, d.reasons) == ("deny", ())
    assert policy.memo_stats()[:2] == (1, 3)
    directory.put(who("alice", "user", "agent-operator"))
    directory.revoke(TENANT, "alice")
    assert (await authorize()).reasons == ("revoked-principal",)
    assert policy.memo_stats()[:2] == (1, 4)


def test_a_role_change_of_the_approver_is_decided_afresh() -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    large = refund(60_000)
    d = policy.may_approve(who("bob", "approver"), large)
    assert (d.effect, d.reasons) == ("deny", ("large-refund-needs-finance",))
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(
        who("bob", "approver", "finance-approver"), large))
    assert (d.effect, d.reasons, hits, misses) == ("allow", ("approvers-approve",), 0, 1)
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(who("bob"), large))
    assert (d.effect, hits, misses) == ("deny", 0, 1)


def test_a_different_amount_is_decided_afresh() -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    bob = who("bob", "approver")
    assert policy.may_approve(bob, refund(100)).effect == "allow"
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(bob, refund(50_001)))
    assert (d.effect, d.reasons, hits, misses) == (
        "deny", ("large-refund-needs-finance",), 0, 1)
    # The requester changes the context too: another requester, another key.
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(
        bob, refund(100, requester=who("carol", "user"))))
    assert (d.effect, hits, misses) == ("allow", 0, 1)
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(bob, refund(100)))
    assert (d.effect, hits, misses) == ("allow", 1, 0)


def test_another_tenants_resource_is_decided_afresh() -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    alice = who("alice", "user")
    assert policy.evaluate(cedar.PolicyRequest(alice, NOTE, "cust-1")).effect == "allow"
    d, hits, misses = stats_after(policy, lambda: policy.evaluate(cedar.PolicyRequest(
        alice, NOTE, "cust-1", resource_tenant_id=OTHER_TENANT)))
    assert (d.effect, d.reasons, hits, misses) == ("deny", ("tenant-boundary",), 0, 1)
    # The same principal id and roles in another tenant is another principal.
    d, hits, misses = stats_after(policy, lambda: policy.evaluate(cedar.PolicyRequest(
        who("alice", "user", tenant=OTHER_TENANT), NOTE, "cust-1")))
    assert (d.effect, hits, misses) == ("allow", 0, 1)
    # Another record, another action: each a key of its own.
    for request in (cedar.PolicyRequest(alice, NOTE, "cust-2"),
                    cedar.PolicyRequest(alice, CONTACT, "cust-1")):
        assert stats_after(policy, lambda r=request: policy.evaluate(r))[1:] == (0, 1)


def test_an_unparseable_request_is_denied_and_not_memoised() -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    broken = dataclasses.replace(NOTE, risk=5)  # type: ignore[arg-type]  # not the schema's
    for _ in range(2):
        d, hits, misses = stats_after(policy, lambda: policy.evaluate(
            cedar.PolicyRequest(who("alice", "user"), broken, "cust-1")))
        assert (d.effect, d.reasons, hits, misses) == ("deny", (), 0, 1)
        assert "policy evaluation failed" in d.reason
    assert policy.memo_stats().entries == 0
    # A number beyond Cedar's 64 bits: Cedar cannot parse the request.
    d, hits, misses = stats_after(policy, lambda: policy.may_approve(
        who("bob", "approver"), refund(2**64)))
    assert (d.effect, hits, misses) == ("deny", 0, 1)
    assert "approval check failed" in d.reason
    # A revocation flag that is not a bool (1 == True in a key): denied before Cedar is asked,
    # never the answer memoised for a principal that is not revoked.
    policy.evaluate(cedar.PolicyRequest(who("alice", "user"), NOTE, "cust-1"))
    d, hits, misses = stats_after(policy, lambda: policy.evaluate(cedar.PolicyRequest(
        cedar.Principal(TENANT, "alice", frozenset({"user"}), revoked=0), NOTE, "cust-1")))  # type: ignore[arg-type]
    assert (d.effect, hits, misses) == ("deny", 0, 0)
    # Not JSON at all: denied before Cedar is asked, nothing counted or kept.
    d, hits, misses = stats_after(policy, lambda: policy.may_deny(
        who("bob", "approver"), tenant_id=TENANT, action=object(),  # type: ignore[arg-type]
        risk="low", connector="crm", resource_id="cust-1"))
    assert (d.effect, hits, misses) == ("deny", 0, 0)
    assert "denial check failed" in d.reason
    assert policy.memo_stats().entries == 1  # alice's note, asked once above


def test_an_evaluation_error_is_not_memoised(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = cedar.CedarPolicy(memo_size=64)
    real = cedarpy.is_authorized_batch
    failures = iter(["raise", "errored"])

    def flaky(requests: list[dict[str, Any]], *args: Any) -> list[cedarpy.AuthzResult]:
        failure = next(failures, None)
        if failure == "raise":
            raise ValueError("cannot parse")
        if failure == "errored":  # even an "Allow" with an error in it denies
            return [cedarpy.AuthzResult({"decision": "Allow", "diagnostics": {
                "reason": [], "errors": ["boom"]}}) for _ in requests]
        return real(requests, *args)

    monkeypatch.setattr(cedarpy, "is_authorized_batch", flaky)

    def ask() -> cedar.CedarDecision:
        return policy.evaluate(cedar.PolicyRequest(who("alice", "user"), NOTE, "cust-1"))

    for _ in range(2):  # a parse failure, then an evaluation error: each denied, neither kept
        d = ask()
        assert (d.effect, d.reason) == ("deny", "crm.note.create: policy evaluation failed; "
                                                "denied")
        assert policy.memo_stats().entries == 0
    d, hits, misses = stats_after(policy, ask)
    assert (d.effect, hits, misses) == ("allow", 0, 1)
    assert stats_after(policy, ask)[1:] == (1, 0)


def test_the_memo_is_bounded_least_recently_used_out() -> None:
    policy = cedar.CedarPolicy(memo_size=2)
    alice = who("alice", "user")

    def ask(resource: str) -> tuple[int, int]:
        return stats_after(policy, lambda: policy.evaluate(
            cedar.PolicyRequest(alice, NOTE, resource)))[1:]

    assert [ask("a"), ask("b"), ask("a"), ask("c")] == [(0, 1), (0, 1), (1, 0), (0, 1)]
    assert policy.memo_stats().entries == 2
    assert [ask("a"), ask("b")] == [(1, 0), (0, 1)]  # "b" was the least recently used


def test_the_bound_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cedar.CedarPolicy().memo_stats().capacity == 4096
    monkeypatch.setenv("AGENTLEDGER_POLICY_MEMO_SIZE", "7")
    assert cedar.CedarPolicy().memo_stats().capacity == 7
    monkeypatch.setenv("AGENTLEDGER_POLICY_MEMO_SIZE", "-1")
    with pytest.raises(pydantic.ValidationError, match="AGENTLEDGER_POLICY_MEMO_SIZE"):
        cedar.CedarPolicy()


def test_new_policies_are_a_new_instance_with_a_memo_of_its_own(tmp_path: Path) -> None:
    shutil.copytree(cedar.DEFAULT_DIR, tmp_path, dirs_exist_ok=True)
    request = cedar.PolicyRequest(who("alice", "user"), NOTE, "cust-1")
    before = cedar.CedarPolicy(tmp_path, memo_size=64)
    assert before.evaluate(request).effect == before.evaluate(request).effect == "allow"
    with (tmp_path / "90_no_notes.cedar").open("w") as f:
        f.write('@id("no-notes")\nforbid (principal, action, resource)\n'
                'when { context.operation.name == "crm.note.create" };\n')
    after = cedar.CedarPolicy(tmp_path, memo_size=64)
    d = after.evaluate(request)
    assert (d.effect, d.reasons, d.policy_version) == ("deny", ("no-notes",), after.version)
    assert after.version != before.version and after.memo_stats()[:2] == (0, 1)
    # The old instance keeps answering for the policy set it loaded (a process that reloads
    # drops it).
    assert fields(before.evaluate(request))[:2] == ("allow", before.version)


def test_threads_share_one_memo_and_get_cedars_answers() -> None:
    memoised, plain = cedar.CedarPolicy(memo_size=64), cedar.CedarPolicy(memo_size=0)
    requests = [cedar.PolicyRequest(who(f"p{i % 4}", "user" if i % 3 else "approver"),
                                    (NOTE, CONTACT)[i % 2], f"cust-{i % 5}") for i in range(20)]
    expected = {i: fields(plain.evaluate(r)) for i, r in enumerate(requests)}
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: (i % 20, fields(memoised.evaluate(requests[i % 20]))),
                            range(400)))
    assert all(expected[i] == f for i, f in got)
    stats = memoised.memo_stats()
    assert stats.hits + stats.misses == 400 and stats.entries == 20
    assert stats.misses < 40  # concurrent first asks of one key may both miss, never more


def test_the_metric_and_the_log_line_count_hits_and_misses(
        caplog: pytest.LogCaptureFixture) -> None:
    reader = InMemoryMetricReader()
    memo.instrument(MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("t"))
    start = memo.totals()
    policy = cedar.CedarPolicy(memo_size=8)
    for _ in range(3):
        policy.evaluate(cedar.PolicyRequest(who("alice", "user"), NOTE, "cust-1"))
    data = reader.get_metrics_data()
    points = {(p.attributes or {})["outcome"]: p.value
              for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
              for m in sm.metrics if m.name == memo.METRIC for p in m.data.data_points
              if isinstance(p, NumberDataPoint)}
    assert points == {"hit": start.hits + 2, "miss": start.misses + 1}
    with caplog.at_level(logging.INFO, logger=memo.__name__):
        memo.log_stats()
    assert f"event=policy_memo_stats hits={start.hits + 2} misses={start.misses + 1}" \
        in caplog.text
