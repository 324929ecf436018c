"""One database login per service for the local and test stacks (issue 17 §7).

A service that connects as a superuser and ``SET ROLE``s to its group role has no boundary:
``RESET ROLE`` gives the superuser back. Production connects each service with its own LOGIN
user, a member of that service's NOLOGIN group role (``deploy/k8s/base/secrets.yaml``);
``ensure`` creates the same logins on a local cluster, so the demo and the tests run every
service with the privileges it will have in production and nothing more.

Passwords are derived from the owner's connection URL (a local or test cluster's superuser
secret), so every session on one cluster derives the same ones and nothing is stored. Never
use this for a production cluster: there, logins and passwords come from the secret manager.
"""

from __future__ import annotations

import hashlib
from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

# service -> (group roles it is a member of, whether it needs REPLICATION itself: a role
# attribute is not inherited). The console decides as admission and reads as an auditor.
SERVICES: Final[dict[str, tuple[tuple[str, ...], bool]]] = {
    "admission": (("agentledger_admission",), False),
    "planner": (("agentledger_planner",), False),
    "executor": (("agentledger_executor",), False),
    "reconciler": (("agentledger_reconciler",), False),
    "relay": (("agentledger_relay",), True),
    "console": (("agentledger_admission", "agentledger_auditor"), False),
    # One function and nothing else: the request hash an operation id holds (0021).
    "ingress": (("agentledger_ingress",), False),
    # Reads only: the principal directory at every request, the ledger for its status tool.
    "mcp": (("agentledger_auditor",), False),
    # The approval notification outbox (0042), across tenants; nothing of the ledger's.
    "notifier": (("agentledger_notifier",), False),
}


def login_name(service: str) -> str:
    """The login role of ``service`` (as the Kubernetes secrets name it)."""
    return f"agentledger_{service}_login"


def _password(owner_url: str, login: str) -> str:
    # From the cluster's address and owner credentials only, never the database: roles are
    # cluster-wide, and sessions on one cluster use different databases (every test pipeline
    # its own). Derived from the whole URL, each session's ``ensure`` changed the password
    # under the services of every other session on the cluster, which then failed to log in.
    parts = urlsplit(owner_url)
    cluster = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    return hashlib.sha256(f"agentledger-local-login\x1f{cluster}\x1f{login}".encode()).hexdigest()


def url_for(owner_url: str, service: str) -> str:
    """``owner_url`` with the credentials of ``service``'s login (same host and database)."""
    login = login_name(service)
    parts = urlsplit(owner_url)
    host = parts.hostname or ""
    netloc = f"{login}:{quote(_password(owner_url, login), safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def ensure(owner_url: str, services: tuple[str, ...] = tuple(SERVICES)) -> dict[str, str]:
    """Create (or refresh) the login of each service on the cluster of ``owner_url``, after
    the migrations created the group roles. Returns each service's connection URL.

    Idempotent and safe to run from several sessions at once: roles are cluster-wide, a
    concurrent creation is recognised, and the derived password is the same for everyone.
    """
    conn = await asyncpg.connect(owner_url)
    try:
        for service in services:
            groups, replication = SERVICES[service]
            login = login_name(service)
            password = _password(owner_url, login)
            attrs = "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE INHERIT " + (
                "REPLICATION" if replication else "NOREPLICATION")
            # Roles are cluster-wide and CREATE ROLE has no IF NOT EXISTS: a lock makes the
            # check and the creation one step among concurrent sessions.
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agentledger.logins'))")
                exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login)
                verb = "ALTER" if exists else "CREATE"
                # Identifiers come from SERVICES above; the password is hex: no quoting issue.
                await conn.execute(f"{verb} ROLE {login} {attrs} PASSWORD '{password}'")
                for group in groups:
                    await conn.execute(f"GRANT {group} TO {login}")
    finally:
        await conn.close()
    return {service: url_for(owner_url, service) for service in services}
