"""Who may use the console and how it refuses: sign-in, cookies, CSRF, the JSON API, the CLI.

Same real pipeline as test_console.py (one per module); Chromium for the pages, HTTP for
the API, typer's runner for the CLI against the running console.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import asyncpg
import pytest
from playwright.sync_api import Browser, Page, expect
from typer.testing import CliRunner

from agentledger import identity
from agentledger.cli import approvals as cli_approvals
from agentledger.policy import repository as policy_repo
from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, SessionIssuer
from tests.browser.conftest import PAGE_TIMEOUT_MS
from tests.browser.support import (
    APPROVER,
    FINANCE,
    HOSTILE,
    api,
    approval_state,
    command_state,
    expire_now,
    refund,
    sync,
)


def signin_page(world: Pipeline, browser: Browser) -> Page:
    assert world.console_url
    context = browser.new_context(base_url=world.console_url)
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    return context.new_page()


def test_only_a_valid_session_with_an_approver_role_signs_in(
        world: Pipeline, browser: Browser) -> None:
    assert world.sessions
    page = signin_page(world, browser)
    try:
        page.goto("/approvals")
        page.wait_for_url("**/signin")  # no session: to the sign-in form
        forged = SessionIssuer.generate()  # same claims, someone else's key
        refused = {
            "no approver role": world.sessions.issue(world.tenant, "user:alice", ["user"]),
            "invalid or expired": "not-a-token",
        }
        for problem, token in [*refused.items(),
                               ("invalid or expired", world.sessions.issue(
                                   world.tenant, "user:bob", APPROVER, ttl_s=-120)),
                               ("invalid or expired", identity.issue_session(
                                   forged.private_pem, world.sessions.kid,
                                   tenant_id=uuid.UUID(world.tenant), subject="user:bob",
                                   audience=world.sessions.audience,
                                   issuer=world.sessions.issuer, roles=APPROVER))]:
            page.goto("/signin")
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page.locator(".flash.bad")).to_contain_text(problem)
            assert page.url.endswith("/signin")
            assert not [c for c in page.context.cookies() if c["name"] == "agentledger_console"]

        page.fill("#token", world.sessions.issue(world.tenant, "user:bob", APPROVER))
        page.click("button[type=submit]")
        page.wait_for_url("**/approvals")
        expect(page.locator("header .who")).to_contain_text("user:bob")
        cookie = next(c for c in page.context.cookies() if c["name"] == "agentledger_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        page.click("header .who button")  # sign out
        page.wait_for_url("**/signin")
        page.goto("/approvals")
        page.wait_for_url("**/signin")
    finally:
        page.context.close()


def test_a_form_post_without_this_sessions_csrf_token_decides_nothing(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    op, approval_id, request_hash = refund(world, 900)
    page = sign_in("user:fiona", FINANCE)
    # The same person's other session. Its token must differ: two tokens issued in the same
    # second with the same claims are byte-identical, i.e. the same session (flaky otherwise).
    other = sign_in("user:fiona", [*FINANCE, "approver"])
    other.goto(f"/approvals/{approval_id}")
    foreign_csrf = other.locator("input[name=csrf]").first.input_value()
    for csrf in ("", "0" * 64, foreign_csrf):
        r = page.request.post(f"/approvals/{approval_id}/approve",
                              form={"csrf": csrf, "shown_hash": request_hash},
                              max_redirects=0)
        assert r.status in (403, 422), r.status
    assert approval_state(world, approval_id) == "pending" and command_state(world, op) is None


def test_a_tampered_shown_hash_approves_nothing(world: Pipeline,
                                               sign_in: Callable[..., Page]) -> None:
    op, approval_id, _ = refund(world, 950)
    page = sign_in("user:fiona", FINANCE)
    page.goto(f"/approvals/{approval_id}")
    page.locator(".decide input[name=shown_hash]").evaluate("(el) => { el.value = 'ab'.repeat(32); }")
    page.click("#approve")
    expect(page.locator("#outcome")).to_contain_text("not the one you were shown")
    expect(page.locator("#state")).to_have_text("pending")
    assert approval_state(world, approval_id) == "pending" and command_state(world, op) is None


def test_the_api_answers_each_refusal_with_its_status(world: Pipeline) -> None:
    assert world.sessions and world.console_url
    bob = world.sessions.issue(world.tenant, "user:bob", APPROVER)
    fiona = world.sessions.issue(world.tenant, "user:fiona", FINANCE)
    op, approval_id, request_hash = refund(world, 75_000)
    path = f"/approvals/{approval_id}"
    assert api(world, "", "GET", "/approvals").status_code == 401
    alice = world.sessions.issue(world.tenant, "user:alice", ["user"])
    assert api(world, alice, "GET", "/approvals").status_code == 403

    detail = api(world, bob, "GET", path).json()
    assert detail["request_hash"] == request_hash and detail["state"] == "pending"
    assert detail["arguments"]["amount_minor"] == 75_000
    assert detail["current"]["record"]["customer_id"] == world.customer

    r = api(world, bob, "POST", f"{path}/approve", {"shown_hash": request_hash})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "not_permitted")  # finance only
    r = api(world, fiona, "POST", f"{path}/approve", {"shown_hash": "cd" * 32})
    assert (r.status_code, r.json()["error"]["code"]) == (422, "mismatch")
    assert api(world, fiona, "POST", f"{path}/approve", {"shown_hash": "short"}).status_code == 422
    assert approval_state(world, approval_id) == "pending" and command_state(world, op) is None

    r = api(world, fiona, "POST", f"{path}/approve", {"shown_hash": request_hash, "reason": "ok"})
    assert r.status_code == 200 and r.json()["state"] == "approved", r.text
    r = api(world, fiona, "POST", f"{path}/deny", {"shown_hash": request_hash})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "already_decided")
    assert world.wait_state(op, "succeeded", "unknown")[0] == "succeeded"

    _, late, late_hash = refund(world, 800)
    expire_now(world, late)
    r = api(world, fiona, "POST", f"/approvals/{late}/approve", {"shown_hash": late_hash})
    assert (r.status_code, r.json()["error"]["code"]) == (410, "expired")
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        assert api(world, fiona, "GET", f"/approvals/{missing}").status_code == 404


def test_the_cli_lists_shows_approves_and_denies(world: Pipeline,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert world.sessions and world.console_url
    monkeypatch.setattr(cli_approvals.console, "width", 200)  # ids and hashes on one line
    runner = CliRunner()
    env = {"AGENTLEDGER_TOKEN": world.sessions.issue(world.tenant, "user:fiona", FINANCE),
           "AGENTLEDGER_CONSOLE_URL": world.console_url}
    op, approval_id, request_hash = refund(world, 1234, excerpt=HOSTILE)
    _, to_deny, _ = refund(world, 4321)

    listed = runner.invoke(cli_approvals.app, ["list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert approval_id in listed.output and to_deny in listed.output

    shown = runner.invoke(cli_approvals.app, ["show", approval_id], env=env)
    assert shown.exit_code == 0, shown.output
    assert request_hash in shown.output and HOSTILE in shown.output  # literal, not markup
    assert "UNTRUSTED evidence E1" in shown.output

    wrong = runner.invoke(cli_approvals.app, ["approve", approval_id, "--hash", "ef" * 32], env=env)
    assert wrong.exit_code == 2 and "mismatch" in wrong.output
    assert approval_state(world, approval_id) == "pending"

    approved = runner.invoke(cli_approvals.app, ["approve", approval_id, "--yes",
                                                 "--reason", "checked in the CLI"], env=env)
    assert approved.exit_code == 0, approved.output
    assert "approved" in approved.output
    assert world.wait_state(op, "succeeded", "unknown")[0] == "succeeded"

    denied = runner.invoke(cli_approvals.app, ["deny", to_deny], env=env, input="y\n")
    assert denied.exit_code == 0 and "denied" in denied.output, denied.output
    assert approval_state(world, to_deny) == "denied"

    anonymous = runner.invoke(cli_approvals.app, ["list"],
                              env={**env, "AGENTLEDGER_TOKEN": ""})
    assert anonymous.exit_code == 2 and "no session token" in anonymous.output


def test_the_directory_not_the_token_decides_who_reads_and_decides(world: Pipeline) -> None:
    # Issue 17: the console trusted the token's roles for every read; only deny asked the
    # directory. A `user` holding a token that claims `approver` read every pending request,
    # and a revoked approver kept reading with an unexpired token.
    assert world.sessions
    op, approval_id, request_hash = refund(world, 4321)
    path = f"/approvals/{approval_id}"
    alice = world.sessions.issue(world.tenant, "user:alice", APPROVER)  # a `user` in the directory
    for method, where, body in (("GET", "/approvals", None), ("GET", path, None),
                                ("POST", f"{path}/deny", {"shown_hash": request_hash})):
        r = api(world, alice, method, where, body)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "not_permitted"), (where, r.text)
        assert "4321" not in r.text

    carol = f"user:carol-{uuid.uuid4().hex[:6]}"
    sync(identities.put_principals(world.database_url, world.tenant, {carol: ["approver"]}))
    token = world.sessions.issue(world.tenant, carol, APPROVER)
    assert api(world, token, "GET", path).json()["arguments"]["amount_minor"] == 4321

    async def revoke() -> None:
        conn = await asyncpg.connect(world.database_url)
        try:
            await policy_repo.revoke_principal(conn, uuid.UUID(world.tenant), carol)
        finally:
            await conn.close()
    explain = f"/operations/{op}/explain"
    assert api(world, token, "GET", explain).status_code in (200, 404)  # answered, while current
    sync(revoke())
    # The same, unexpired token; issue 38: the explain API did not ask the directory.
    for method, where in (("GET", "/approvals"), ("GET", path), ("GET", explain)):
        assert api(world, token, method, where).status_code == 403, where
    assert approval_state(world, approval_id) == "pending" and command_state(world, op) is None


def test_sign_out_is_never_a_cross_site_get_nor_a_forged_post(
        world: Pipeline, sign_in: Callable[..., Page]) -> None:
    # Issue 17 §7: logout was a GET any page could trigger with an <img>. It is a POST that
    # carries this session's CSRF token; anything else signs nobody out.
    page = sign_in("user:bob", APPROVER)
    r = page.request.get("/signout", max_redirects=0)
    assert r.status == 405, r.status
    for csrf in ("", "0" * 64):
        r = page.request.post("/signout", form={"csrf": csrf}, max_redirects=0)
        assert r.status in (403, 422), r.status
    page.goto("/approvals")
    expect(page.locator("header .who")).to_contain_text("user:bob")  # still signed in
    page.click("header .who button")  # the real form signs out
    page.wait_for_url("**/signin")
    assert not [c for c in page.context.cookies() if c["name"] == "agentledger_console"]
