"""Server-rendered pages: sign-in, the pending list, a request's review, approve and deny.

Forms post back here and are answered with a redirect (post/redirect/get) to the page with
a fixed message key, so reloading never decides twice and no request input is reflected.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import logging
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast, get_args

import jinja2
from fastapi import APIRouter, Cookie, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger import errors, identity
from agentledger.approvals import repository as approvals
from agentledger.services.console import answers, auth, narrowing_form, review

log = logging.getLogger(__name__)

pages = APIRouter(default_response_class=HTMLResponse)

# Autoescape everywhere: evidence, arguments and records are untrusted data, and no
# template marks any of them safe.
TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True, undefined=jinja2.StrictUndefined,
)
TEMPLATES.filters["time_left"] = review.time_left
STATES: tuple[str, ...] = get_args(approvals.State)

Token = Annotated[str | None, Cookie(alias=auth.SESSION_COOKIE, max_length=4096)]
Csrf = Annotated[str, Form(max_length=128)]


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = TEMPLATES.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status)


def _gate(request: Request) -> auth.Gate:
    return cast(auth.Gate, request.app.state.gate)


def _console(request: Request) -> review.Console:
    return cast(review.Console, request.app.state.console)


class Signed:
    """A verified page session, with the token its CSRF token derives from."""

    def __init__(self, session: identity.Session, token: str, csrf: str) -> None:
        self.session, self.token, self.csrf = session, token, csrf


def signed(request: Request, token: Token = None) -> Signed:
    gate = _gate(request)
    try:
        session = gate.verify(token)
    except (errors.IdentityRejected, auth.NotAnApprover) as exc:
        raise auth.SignInRequired from exc
    assert token is not None
    return Signed(session, token, gate.csrf_token(token))


Session = Annotated[Signed, Depends(signed)]


def _check_csrf(request: Request, who: Signed, submitted: str) -> None:
    if not _gate(request).csrf_ok(who.token, submitted):
        log.warning("event=csrf_rejected principal_id=%s", who.session.principal_id)
        raise auth.CsrfRejected


@pages.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/approvals", status_code=303)


@pages.get("/signin")
async def signin_form(request: Request) -> HTMLResponse:
    return _signin_page(request, None, 200)


def _signin_page(request: Request, problem: str | None, status: int) -> HTMLResponse:
    pre = secrets.token_urlsafe(24)
    response = render("signin.html", status, problem=problem, pre=pre, who=None)
    response.set_cookie(auth.PRESESSION_COOKIE, pre, max_age=900, httponly=True,
                        samesite="strict", secure=request.app.state.cookie_secure,
                        path="/signin")
    return response


@pages.post("/signin")
async def signin(
    request: Request, token: Annotated[str, Form(max_length=4096)],
    pre: Annotated[str, Form(max_length=128)],
    pre_cookie: Annotated[str | None, Cookie(alias=auth.PRESESSION_COOKIE)] = None,
) -> Response:
    if pre_cookie is None or not secrets.compare_digest(pre, pre_cookie):
        return _signin_page(request, "The sign-in form expired; please paste the token again.",
                            400)
    token = token.strip()
    try:
        session = _gate(request).verify(token)
    except auth.NotAnApprover:
        return _signin_page(request, "This session has no approver role.", 403)
    except errors.IdentityRejected as exc:
        # The precise reason is logged, not shown: it would help forge the next token.
        log.info("event=signin_rejected reason=%s", exc.message[:200])
        return _signin_page(request, "The session token is invalid or expired.", 401)
    log.info("event=signin tenant_id=%s principal_id=%s", session.tenant_id,
             session.principal_id)
    response = RedirectResponse("/approvals", status_code=303)
    max_age = int((session.expires_at - datetime.now(UTC)).total_seconds())
    response.set_cookie(auth.SESSION_COOKIE, token, max_age=max(0, max_age), httponly=True,
                        samesite="strict", secure=request.app.state.cookie_secure, path="/")
    response.delete_cookie(auth.PRESESSION_COOKIE, path="/signin")
    return response


@pages.post("/signout")
async def signout(request: Request, who: Session, csrf: Csrf) -> RedirectResponse:
    _check_csrf(request, who, csrf)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(auth.SESSION_COOKIE, path="/")
    return response


@pages.get("/approvals")
async def approval_list(
    request: Request, who: Session,
    state: Annotated[str, Query(max_length=16)] = "pending",
) -> HTMLResponse:
    if state not in STATES:
        state = "pending"
    found = await _console(request).listing(who.session, cast(approvals.State, state))
    return render("list.html", who=who, reviews=found, state=state, states=STATES)


@pages.get("/approvals/{approval_id}")
async def approval_detail(
    request: Request, approval_id: str, who: Session,
    outcome: Annotated[str | None, Query(max_length=32)] = None,
) -> HTMLResponse:
    found = await _console(request).review(who.session, answers.approval_id(approval_id))
    message = answers.MESSAGES.get(outcome or "")
    good = outcome in ("approved", "denied", "pending", "narrow_done")
    return render("detail.html", who=who, r=found, message=message, good=good)


async def _decide(request: Request, approval_id: str, who: Signed, csrf: str,
                  shown_hash: str, reason: str, *, approve: bool) -> RedirectResponse:
    _check_csrf(request, who, csrf)
    aid = answers.approval_id(approval_id)
    outcome: str
    try:
        decided, _ = await _console(request).decide(
            who.session, aid, approve=approve, shown_hash=shown_hash, reason=reason)
        outcome = decided.state
    except errors.AgentLedgerError as exc:
        answer = answers.of(exc)
        if answer.code == "not_found":
            raise
        log.info("event=decision_refused approval_id=%s code=%s", aid, answer.code)
        outcome = answer.code
    return RedirectResponse(f"/approvals/{aid}?outcome={outcome}", status_code=303)


Hash = Annotated[str, Form(max_length=128)]
Reason = Annotated[str, Form(max_length=500)]


@pages.post("/approvals/{approval_id}/approve")
async def approve(request: Request, approval_id: str, who: Session, csrf: Csrf,
                  shown_hash: Hash, reason: Reason = "") -> RedirectResponse:
    return await _decide(request, approval_id, who, csrf, shown_hash, reason, approve=True)


@pages.post("/approvals/{approval_id}/deny")
async def deny(request: Request, approval_id: str, who: Session, csrf: Csrf,
               shown_hash: Hash, reason: Reason = "") -> RedirectResponse:
    return await _decide(request, approval_id, who, csrf, shown_hash, reason, approve=False)


@pages.post("/approvals/{approval_id}/narrow")
async def narrow(request: Request, approval_id: str, who: Session, csrf: Csrf,
                 shown_hash: Hash, reason: Reason = "") -> RedirectResponse:
    """Narrow the request and approve the narrowed one (issue 42): the form carries the new
    value of each narrowable field (``narrow.<field>``); every other argument is the
    original's. Whether that only narrows is the library's to say."""
    _check_csrf(request, who, csrf)
    aid = answers.approval_id(approval_id)
    console = _console(request)
    form = await request.form()
    try:
        found = await console.review(who.session, aid)
        arguments = narrowing_form.arguments(
            found.arguments, found.narrowable,
            {k: [v for v in form.getlist(k) if isinstance(v, str)] for k in form})
        done = await console.narrow(who.session, aid, shown_hash=shown_hash,
                                    arguments=arguments, reason=reason)
    except errors.AgentLedgerError as exc:
        answer = answers.of(exc)
        if answer.code == "not_found":
            raise
        log.info("event=narrowing_refused approval_id=%s code=%s", aid, answer.code)
        return RedirectResponse(f"/approvals/{aid}?outcome={answer.code}", status_code=303)
    return RedirectResponse(f"/approvals/{done.narrowed.approval_id}?outcome=narrow_done",
                            status_code=303)
