"""The approvals console in Chromium, with every service behind it a real process (SPEC R2.4, R2.5).

Proposals go through Kafka to admission, which persists the approval request; a person
decides in the console; approved commands flow through the relay to the executors and
the CRM. Assertions are on the page, the ledger and the CRM's effect log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
from playwright.sync_api import Page, expect

from agentledger import settings
from agentledger.testing.pipeline import Pipeline
from tests.browser.support import (
    APPROVER,
    CONTACT,
    FINANCE,
    HOSTILE,
    REFUND,
    api,
    approval_state,
    command_state,
    current_revision,
    effects,
    expire_now,
    open_detail,
    pending_approval,
    refund,
    sync,
)

# The README's picture; a test run refreshes it only when asked, so `make test` leaves the
# working tree as it found it.
SCREENSHOT = settings.REPO_ROOT / "docs" / "images" / "console-detail.png"
REFRESH_DOCS = os.environ.get("AGENTLEDGER_REFRESH_DOC_IMAGES") == "1"


def test_evidence_with_script_and_html_is_shown_inert_and_the_detail_is_screenshotted(
        world: Pipeline, sign_in: Callable[..., Page], tmp_path: Path) -> None:
    op, approval_id, request_hash = refund(world, 2450, excerpt=HOSTILE)
    page = sign_in("user:fiona", FINANCE)
    open_detail(page, approval_id)
    excerpt = page.locator("#evidence article.untrusted pre.excerpt")
    expect(excerpt).to_have_text(HOSTILE)  # the markup is visible literally, as text
    assert page.locator("#evidence script, #evidence img, #evidence b").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    expect(page.locator("#evidence")).to_contain_text("untrusted")
    expect(page.locator("#evidence article.untrusted header")).to_contain_text("E1")
    # The concrete change, the bound hash, the policy version, the time left, the requester.
    expect(page.locator("#refund .amount")).to_have_text("24.50 EUR")
    expect(page.locator("#refund")).to_contain_text("inv-2026-0042")
    expect(page.locator("#refund")).to_contain_text("ada@example.com")  # the current record
    expect(page.locator("#hash")).to_have_text(request_hash)
    expect(page.locator(".decide input[name=shown_hash]")).to_have_value(request_hash)
    expect(page.locator("#policy-version")).to_have_text(world_policy_version(world, approval_id))
    expect(page.locator("#time-left")).to_contain_text("min left")
    expect(page.locator("#requester")).to_have_text("user:alice")
    expect(page.locator("#arguments")).to_contain_text('"amount_minor": 2450')
    shot = SCREENSHOT if REFRESH_DOCS else tmp_path / SCREENSHOT.name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty image
    assert page.evaluate("() => window.__pwned") is None
    assert command_state(world, op) is None  # looking decides nothing


def world_policy_version(world: Pipeline, approval_id: str) -> str:
    conn = psycopg2.connect(world.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT policy_version FROM approval_request WHERE approval_id = %s",
                        (approval_id,))
            row = cur.fetchone()
    finally:
        conn.close()
    assert row is not None
    return str(row[0])


def test_approving_a_refund_makes_the_refund_in_the_crm_and_the_command_succeeds(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    op, approval_id, _ = refund(world, 60_000)
    # Refunds carry no idempotency key (billing is not keyed): count the tenant's refunds.
    before = len(effects(world, "refund.created"))
    page = sign_in("user:fiona", FINANCE)
    expect(page.locator(f"tr[data-approval-id='{approval_id}']")).to_contain_text(REFUND)
    open_detail(page, approval_id)
    page.fill("#reason", "invoice checked")
    page.click("#approve")
    expect(page.locator("#outcome")).to_contain_text("Approved")
    expect(page.locator("#state")).to_have_text("approved")
    expect(page.locator("#approve")).to_have_count(0)
    state, receipt = world.wait_state(op, "succeeded", "unknown")
    assert state == "succeeded" and receipt
    assert len(effects(world, "refund.created")) == before + 1


def test_denying_leads_to_no_effect(world: Pipeline, sign_in: Callable[..., Page]) -> None:
    op, approval_id, _ = refund(world, 1500)
    before = len(effects(world, "refund.created"))
    page = sign_in("user:bob", APPROVER)
    open_detail(page, approval_id)
    page.fill("#reason", "not our invoice")
    page.click("#deny")
    expect(page.locator("#outcome")).to_contain_text("Denied")
    expect(page.locator("#state")).to_have_text("denied")
    assert approval_state(world, approval_id) == "denied"
    assert command_state(world, op) is None  # nothing admitted, so nothing can ever run
    assert len(effects(world, "refund.created")) == before


def test_an_expired_approval_cannot_be_approved(world: Pipeline,
                                                sign_in: Callable[..., Page]) -> None:
    op, approval_id, _ = refund(world, 1200)
    page = sign_in("user:fiona", FINANCE)
    open_detail(page, approval_id)  # the page was loaded while the request was pending
    expire_now(world, approval_id)
    page.click("#approve")
    expect(page.locator("#outcome")).to_contain_text("expired")
    expect(page.locator("#state")).to_have_text("expired")
    expect(page.locator("#approve")).to_have_count(0)
    assert approval_state(world, approval_id) == "expired"
    assert command_state(world, op) is None


def test_a_changed_target_revision_supersedes_and_the_old_approval_cannot_admit(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    assert world.sessions
    revision = current_revision(world)
    op = world.propose(CONTACT, {"changes": {"email": "new@example.com"}},
                       expected_revision=revision)
    old_id, old_hash = pending_approval(world, op)
    page = sign_in("user:bob", APPROVER)
    open_detail(page, old_id)
    row = page.locator("#diff tr", has_text="email")
    expect(row.locator("td.after")).to_have_text("new@example.com")
    expect(row.locator("td.before")).to_have_text(
        str(sync(_record(world))["email"]))
    expect(page.locator("#stale")).to_have_count(0)

    sync(world.crm.customer(world.tenant, world.customer, email="changed@example.com"))
    page.reload()
    expect(page.locator("#stale")).to_be_visible()  # the diff is against the CURRENT record
    expect(row.locator("td.before")).to_have_text("changed@example.com")
    page.click("#approve")
    expect(page.locator("#outcome")).to_contain_text("superseded")
    expect(page.locator("#state")).to_have_text("superseded")
    assert approval_state(world, old_id) == "superseded"
    assert command_state(world, op) is None

    # The agent proposes again on the current record: a new request; the old approval is
    # closed for good, with its own hash or the new one.
    op_again = world.propose(CONTACT, {"changes": {"email": "new@example.com"}},
                             operation_id=op, expected_revision=current_revision(world))
    new_id, new_hash = pending_approval(world, op_again)
    assert (new_id, new_hash) != (old_id, old_hash)
    token = world.sessions.issue(world.tenant, "user:bob", APPROVER)
    for shown in (old_hash, new_hash):
        r = api(world, token, "POST", f"/approvals/{old_id}/approve", {"shown_hash": shown})
        assert r.status_code == 409, r.text
    assert command_state(world, op) is None
    r = api(world, token, "POST", f"/approvals/{new_id}/approve", {"shown_hash": new_hash})
    assert r.status_code == 200 and r.json()["admitted"] == "admitted", r.text
    assert world.wait_state(op, "succeeded")[0] == "succeeded"
    assert sync(_record(world))["email"] == "new@example.com"


async def _record(world: Pipeline) -> dict[str, Any]:
    async with world.crm.client(world.tokens["read"]) as client:
        r = await client.get(f"/v1/customers/{world.customer}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_an_approver_of_one_tenant_sees_none_of_another_tenants_requests(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    assert world.sessions and world.console_url
    other = next(iter(world.others))
    _, theirs, their_hash = refund(world, 1000, tenant=other)
    page = sign_in("user:fiona", FINANCE)
    page.goto("/approvals")
    expect(page.locator(f"tr[data-approval-id='{theirs}']")).to_have_count(0)
    response = page.goto(f"/approvals/{theirs}")
    assert response is not None and response.status == 404
    expect(page.locator("main")).to_contain_text("No such approval request")

    mine = world.sessions.issue(world.tenant, "user:fiona", FINANCE)
    listed = api(world, mine, "GET", "/approvals").json()["approvals"]
    assert theirs not in {a["approval_id"] for a in listed}
    assert api(world, mine, "GET", f"/approvals/{theirs}").status_code == 404
    for verb in ("approve", "deny"):
        r = api(world, mine, "POST", f"/approvals/{theirs}/{verb}", {"shown_hash": their_hash})
        assert r.status_code == 404, r.text
    assert approval_state(world, theirs) == "pending"

    # Their own approver does see it: the request is there, just not for us.
    own = world.sessions.issue(other, "user:fiona", FINANCE)
    assert theirs in {a["approval_id"] for a in api(world, own, "GET", "/approvals").json()["approvals"]}
    other_page = sign_in("user:fiona", FINANCE, tenant=other)
    expect(other_page.locator(f"tr[data-approval-id='{theirs}']")).to_have_count(1)
