"""Console wiring: FastAPI app, database pool, CRM client, errors, security headers, health."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException

from agentledger import crypto, db, errors, web
from agentledger import settings as shared
from agentledger.ledger import keys
from agentledger.policy import allowlist
from agentledger.policy import check as policy_check
from agentledger.policy import repository as policy_repo
from agentledger.resources import crm_client
from agentledger.services.console import answers, api, auth, pages, review
from agentledger.services.console.settings import ConsoleSettings

log = logging.getLogger(__name__)

# A readiness probe must answer well inside the orchestrator's probe timeout.
READY_TIMEOUT_S = 2.0
STYLESHEET = Path(__file__).parent / "static" / "console.css"

# No script at all, styles from here only, forms post only here, never framed: even a
# rendering mistake in an evidence excerpt could not run code or send a form elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _json_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _page_error(request: Request, status: int, message: str) -> Response:
    return pages.render("error.html", status, message=message, who=None)


async def _agentledger_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.AgentLedgerError)
    if isinstance(exc, auth.CsrfRejected):
        message = "This form did not come from the console (or your session changed). Reload."
        return (_json_error(403, exc.code, message) if _is_api(request)
                else _page_error(request, 403, message))
    if isinstance(exc, auth.NotAnApprover):
        return _json_error(403, "not_an_approver", exc.message)
    if isinstance(exc, errors.IdentityRejected):
        log.info("event=request_rejected code=%s reason=%s", exc.code, exc.message[:200])
        response = _json_error(web.status_of(exc), exc.code,
                               "the session token is missing or invalid")
        response.headers["www-authenticate"] = "Bearer"
        return response
    answer = answers.of(exc)
    if answer.status >= 500:
        log.warning("event=console_unavailable code=%s reason=%s", exc.code, exc.message[:200])
    if _is_api(request):
        return _json_error(answer.status, answer.code, answer.message)
    return _page_error(request, answer.status, answer.message)


async def _sign_in(request: Request, exc: Exception) -> Response:
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(auth.SESSION_COOKIE, path="/")
    return response


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    # Location and reason only: the offending input is never echoed back.
    problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: "
                         f"{e.get('msg', 'invalid')}" for e in exc.errors())
    if _is_api(request):
        return _json_error(422, "invalid_request", problems[:1000])
    return _page_error(request, 422, "The form was incomplete or too long.")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if _is_api(request):
        return _json_error(exc.status_code, "http_error", str(exc.detail))
    return _page_error(request, exc.status_code, str(exc.detail))


def create_app(settings: ConsoleSettings | None = None) -> FastAPI:
    """The console's ASGI app; the pool and the CRM client open in its lifespan."""
    cfg = settings or ConsoleSettings.model_validate({})
    gate = auth.Gate.create(
        cfg.session_keys, issuer=cfg.session_issuer, audience=cfg.session_audience,
        csrf_secret=cfg.csrf_secret.get_secret_value() if cfg.csrf_secret else None)
    master = crypto.MasterKey.from_b64(cfg.master_key.get_secret_value())
    # A narrowed request's quorum and charges come from the operator's rules (issue 42): bad
    # ones stop the console here, before anything is connected, naming what (as
    # `agentledger check-config` does).
    rules = allowlist.Allowlist.load()
    sources = shared.PolicySources()
    approval_rules = policy_check.load_approvals(sources.approvals, rules)
    budgets = policy_check.load_budgets(sources.budgets, rules)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await db.create_pool(cfg.database_url, role=cfg.db_role, size=cfg.pool_size)
        client = httpx.AsyncClient(base_url=cfg.crm_url, timeout=cfg.crm_timeout_s)
        # `explain` reads the audit ledger, which only the auditor role may read.
        audit_pool = await db.create_pool(cfg.database_url, role="agentledger_auditor", size=2)
        app.state.audit_pool = audit_pool
        app.state.pool = pool
        app.state.console = review.Console(
            pool=pool, allowlist=rules,
            authorizer=policy_repo.CedarAuthorizer(), cipher=keys.PayloadCipher(master),
            records=review.CurrentRecords(crm_client.CrmReader(cfg.crm_url, cfg.crm_read_tokens,
                                                        client=client)),
            approval_rules=approval_rules, budgets=budgets)
        log.info("event=console_ready port=%s", cfg.port)
        try:
            yield
        finally:
            await client.aclose()
            await audit_pool.close()
            await pool.close()

    app = FastAPI(title="agentledger approvals console", version="1", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.gate = gate
    app.state.cookie_secure = cfg.cookie_secure
    app.add_exception_handler(errors.AgentLedgerError, _agentledger_error)
    app.add_exception_handler(auth.SignInRequired, _sign_in)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        pool = getattr(request.app.state, "pool", None)
        if pool is None:
            return _json_error(503, "starting", "the database pool is not open yet")
        try:
            async with pool.acquire(timeout=READY_TIMEOUT_S) as conn:
                await conn.fetchval("SELECT 1", timeout=READY_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return _json_error(503, "database_unavailable", "PostgreSQL did not answer")
        return JSONResponse({"status": "ready"})

    @app.get("/static/console.css", include_in_schema=False)
    async def stylesheet() -> FileResponse:
        return FileResponse(STYLESHEET, media_type="text/css")

    app.include_router(pages.pages)
    app.include_router(api.api)
    app.add_middleware(web.BodyLimit, limit=cfg.max_body_bytes)
    return app
