"""The CRM stand-in as a real subprocess on a free port, and its admin API (tenants, tokens,
customers, the effect log, fault rules) for whoever drives it: tests, bench."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentledger.testing.polling import wait_until
from agentledger.testing.processes import free_port

ADMIN_TOKEN = "admin-" + secrets.token_hex(8)
# Startup is a Python import plus a pool and an idempotent schema: seconds, not tens.
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    customer_id: str
    token: str  # read, write and lookup


@dataclass(frozen=True)
class Crm:
    """A running CRM stand-in: its URL, its database, its log and its admin token (the
    demo's CRM has its own; the ones started here share ``ADMIN_TOKEN``)."""

    url: str
    database_url: str
    log_path: Path
    admin_token: str = ADMIN_TOKEN

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, **kwargs)

    def admin(self) -> httpx.AsyncClient:
        return self.client(self.admin_token, timeout=10)

    async def token(self, tenant_id: str | uuid.UUID, *scopes: str) -> str:
        async with self.admin() as admin:
            r = await admin.post(f"/admin/tenants/{tenant_id}/tokens", json={"scopes": scopes})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])

    async def customer(self, tenant_id: str | uuid.UUID, customer_id: str, **contact: Any
                       ) -> dict[str, Any]:
        async with self.admin() as admin:
            r = await admin.put(f"/admin/tenants/{tenant_id}/customers/{customer_id}",
                                json={"display_name": customer_id, **contact})
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def new_tenant(self) -> Tenant:
        """A tenant nobody else uses, with one customer and an all-scopes token."""
        tenant = Tenant(f"t-{uuid.uuid4().hex[:12]}", f"c-{uuid.uuid4().hex[:8]}", "")
        await self.customer(tenant.tenant_id, tenant.customer_id, email="ada@example.com")
        token = await self.token(tenant.tenant_id, "read", "write", "lookup")
        return Tenant(tenant.tenant_id, tenant.customer_id, token)

    async def effects(self, tenant_id: str | uuid.UUID) -> list[dict[str, Any]]:
        async with self.admin() as admin:
            r = await admin.get("/admin/effects", params={"tenant": str(tenant_id)})
        assert r.status_code == 200, r.text
        return list(r.json()["effects"])

    async def arm(self, rule: dict[str, Any]) -> None:
        """Arm a fault rule, e.g. ``{"match": {"method": "POST", "path_prefix": "/v1/refunds"},
        "action": "drop_after_commit", "times": 1}``: commit, then lose the answer."""
        async with self.admin() as admin:
            r = await admin.post("/admin/faults", json=rule)
        assert r.status_code == 201, r.text

    async def armed(self) -> list[dict[str, Any]]:
        """The rules still armed (a rule used up is gone)."""
        async with self.admin() as admin:
            r = await admin.get("/admin/faults")
        assert r.status_code == 200, r.text
        return list(r.json()["rules"])

    async def disarm(self) -> None:
        async with self.admin() as admin:
            r = await admin.delete("/admin/faults")
        assert r.status_code == 204, r.text


@contextmanager
def run_crm(database_url: str, log_dir: Path, *, prefix: Sequence[str] = (),
            url_host: str = "127.0.0.1", **settings: str) -> Iterator[Crm]:
    """Start ``python -m agentledger.services.crm``, wait for /readyz, stop it at the end.

    ``prefix`` runs it under another command (``ip netns exec NAME``: in a network
    namespace, tests/netns.py), reached at ``url_host``."""
    port = free_port()
    env = {
        **os.environ,
        "AGENTLEDGER_CRM_DATABASE_URL": database_url,
        "AGENTLEDGER_CRM_HOST": "127.0.0.1",
        "AGENTLEDGER_CRM_PORT": str(port),
        "AGENTLEDGER_CRM_ADMIN_TOKEN": ADMIN_TOKEN,
        **{f"AGENTLEDGER_CRM_{k.upper()}": v for k, v in settings.items()},
    }
    log_path = log_dir / f"crm-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and service
            [*prefix, sys.executable, "-m", "agentledger.services.crm"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        crm = Crm(f"http://{url_host}:{port}", database_url, log_path)
        try:
            def ready() -> bool:
                assert process.poll() is None, f"CRM exited:\n{log_path.read_text()}"
                try:
                    return httpx.get(f"{crm.url}/readyz", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            assert wait_until(ready, timeout=READY_TIMEOUT), log_path.read_text()
            yield crm
        finally:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
