"""Wiring of the CRM stand-in: the FastAPI app, its pool, health, error shape, faults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from agentledger.services.crm import errors, faults, handlers, store
from agentledger.services.crm import settings as settings_mod

log = logging.getLogger(__name__)

# Expired keys are already invisible to lookups and claimable again; purging only bounds
# the table, so once a minute (or once per window, if shorter) is plenty.
MAX_PURGE_INTERVAL_SECONDS = 60.0


class CrmApp(FastAPI):
    """FastAPI with the fault middleware OUTSIDE Starlette's own error middleware.

    Only the outermost layer holds the server's ``send`` (and through it the socket), which
    ``drop_after_commit`` needs to close the connection with no response at all.
    """

    armed_faults: faults.Faults | None = None

    def build_middleware_stack(self) -> ASGIApp:
        app = super().build_middleware_stack()
        return app if self.armed_faults is None else faults.Middleware(app, self.armed_faults)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def _crm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.CrmError)
    log.info("event=request_rejected code=%s status=%s method=%s path=%s",
             exc.code, exc.status, request.method, request.url.path)
    response = _error(exc.status, exc.code, exc.message)
    if isinstance(exc, errors.Unauthenticated):
        response.headers["www-authenticate"] = "Bearer"
    return response


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Location and reason only: the offending input is never echoed back or logged.
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
        for e in exc.errors()
    )
    return _error(422, "invalid_request", problems[:1000])


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


async def _purge_forever(crm: store.Store, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            purged = await crm.purge_expired_keys()
        except errors.StorageError:
            log.warning("event=purge_failed", exc_info=True)
        else:
            if purged:
                log.info("event=keys_purged count=%d", purged)


def create_app(settings: settings_mod.Settings) -> CrmApp:
    """The CRM ASGI app; the database pool opens in its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with store.Store.open(
            settings.database_url,
            retention_seconds=settings.idempotency_retention_seconds,
            max_size=settings.pool_max_size,
        ) as crm:
            app.state.store = crm
            purger = asyncio.create_task(_purge_forever(
                crm, min(settings.idempotency_retention_seconds, MAX_PURGE_INTERVAL_SECONDS)
            ))
            log.info("event=crm_ready faults_enabled=%s", settings.faults_enabled)
            try:
                yield
            finally:
                purger.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await purger

    app = CrmApp(title="agentledger CRM stand-in", lifespan=lifespan)
    app.state.settings = settings
    app.add_exception_handler(errors.CrmError, _crm_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> dict[str, str]:
        crm: store.Store = request.app.state.store
        await crm.ping()
        return {"status": "ready"}

    app.include_router(handlers.api)
    if settings.admin_token is not None:
        app.include_router(handlers.admin)
    if settings.faults_enabled:
        app.armed_faults = faults.Faults()
        app.state.faults = app.armed_faults
        app.include_router(handlers.fault_admin)
    return app
