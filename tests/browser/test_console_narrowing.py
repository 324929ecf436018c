"""Narrow-only edits in the console's page, in Chromium, every service a process (issue 42).

A finance approver lowers a 617.00 EUR refund to 413.00 in the detail page's narrow form and
approves it in the same step: the page moves to the narrowed request, which shows the
original and the narrowed amount; the refund runs once, for 413.00 (the provider's refunds
read from its database), never for 617.00; the original's page says it was narrowed and
links to the narrowed one. A widening typed past the form's own bound is refused by the
server and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg2
from playwright.sync_api import Page, expect

from agentledger.testing.pipeline import Pipeline
from tests.browser.support import FINANCE, approval_state, command_state, open_detail, refund


def _refunds_of(world: Pipeline, amount: int) -> int:
    conn = psycopg2.connect(world.crm.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM crm_refund WHERE tenant_id = %s "
                        "AND amount_cents = %s", (world.tenant, amount))
            row = cur.fetchone()
    finally:
        conn.close()
    return int(row[0]) if row else 0


def test_a_refund_narrowed_in_the_page_runs_the_lower_amount_once(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    op, approval_id, _ = refund(world, 61_700)
    page = sign_in("user:fiona", FINANCE)
    open_detail(page, approval_id)
    amount = page.locator("#narrow-amount_minor")
    expect(amount).to_have_value("61700")
    amount.fill("41300")
    page.fill("#narrow-reason", "partial refund agreed")
    page.click("#narrow-approve")
    expect(page.locator("#outcome")).to_contain_text("Narrowed")
    expect(page.locator("#state")).to_have_text("approved")
    expect(page.locator("#refund .amount")).to_have_text("413.00 EUR")
    row = page.locator("#narrowed-changes tr", has_text="amount_minor")
    expect(row.locator("td.before")).to_have_text("61700")
    expect(row.locator("td.after")).to_have_text("41300")
    expect(page.locator("#narrow")).to_have_count(0)  # decided: nothing more to narrow
    assert approval_state(world, approval_id) == "narrowed"
    state, receipt = world.wait_state(op, "succeeded", "unknown")
    assert state == "succeeded" and receipt
    assert (_refunds_of(world, 41_300), _refunds_of(world, 61_700)) == (1, 0)

    open_detail_of(page, approval_id)
    expect(page.locator("#state")).to_have_text("narrowed")
    expect(page.locator("#narrowed")).to_contain_text("never runs")
    expect(page.locator("#approve")).to_have_count(0)
    page.click("#narrowed-to")
    expect(page.locator("#narrowed-from")).to_contain_text("Narrowed from")


def open_detail_of(page: Page, approval_id: str) -> None:
    """A decided request is not on the pending list: open it by its address."""
    page.goto(f"/approvals/{approval_id}")


def test_a_widening_past_the_forms_bound_is_refused_by_the_server(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    op, approval_id, request_hash = refund(world, 61_900)
    page = sign_in("user:fiona", FINANCE)
    open_detail(page, approval_id)
    # The form bounds the amount; a hand-edited form is the server's to refuse.
    page.locator("#narrow-amount_minor").evaluate("(el) => el.removeAttribute('max')")
    page.fill("#narrow-amount_minor", "71900")
    page.click("#narrow-approve")
    expect(page.locator("#outcome")).to_contain_text("does not only narrow")
    expect(page.locator("#state")).to_have_text("pending")
    expect(page.locator("#hash")).to_have_text(request_hash)
    assert approval_state(world, approval_id) == "pending"
    assert command_state(world, op) is None
