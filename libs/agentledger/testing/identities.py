"""Development identities for tests, bench and tools: an ingress envelope key pair generated
at import (never a deployment's key), principals in the policy directory, and the session
tokens of a throwaway identity provider with the operator shell that trusts it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

from agentledger import identity
from agentledger.policy import repository as policy_repo

PRIVATE_PEM, PUBLIC_PEM = identity.generate_keypair("EdDSA")
KID = "ingress-test"
SIGNER = identity.EnvelopeSigner(PRIVATE_PEM, KID)
ENVELOPE_KEYS = {KID: PUBLIC_PEM}
KEYSET = identity.KeySet.from_pem(ENVELOPE_KEYS)


def sign(proposal: dict[str, Any], *, request_id: uuid.UUID | None = None,
         ttl_s: int | None = None) -> dict[str, Any]:
    """The proposal with an envelope binding its tenant, principal, operation id and content,
    as ingress signs a gateway's proposal (valid ``ttl_s`` seconds, default ingress' lifetime)."""
    signer = SIGNER if ttl_s is None else identity.EnvelopeSigner(PRIVATE_PEM, KID, ttl_s=ttl_s)
    tenant = uuid.UUID(str(proposal["tenant_id"]))
    envelope = signer.sign(
        tenant_id=tenant, principal_id=proposal["principal_id"],
        operation_id=uuid.UUID(str(proposal["operation_id"])),
        request_id=request_id or uuid.uuid4(),
        binding=identity.proposal_binding(
            tenant_id=tenant, principal_id=proposal["principal_id"], action=proposal["action"],
            target=proposal["target"], arguments=proposal["arguments"],
            expected_revision=proposal.get("expected_revision")))
    return {**proposal, "identity": envelope}


async def put_principals(
    database_url: str, tenant_id: uuid.UUID | str, principals: Mapping[str, Iterable[str]]
) -> None:
    """Record principals and their roles (an operator's act, with the owner's rights)."""
    conn = await asyncpg.connect(database_url)
    try:
        for principal, roles in principals.items():
            await policy_repo.put_principal(conn, uuid.UUID(str(tenant_id)), principal, roles)
    finally:
        await conn.close()


# Who acts in tests: an agent user, an approver for ordinary approvals, finance for refunds.
DEFAULT_PRINCIPALS = {"user:alice": ["user"], "user:bob": ["approver"],
                      "user:fiona": ["finance-approver"]}


# The identity provider of session tokens (the console's and the operator commands'), and who
# operates: `agent-operator` in the directory AND in the token's claims, like the console's
# approvers.
SESSION_PRIVATE, SESSION_PUBLIC = identity.generate_keypair("EdDSA")
SESSION_KID, SESSION_ISSUER, SESSION_AUDIENCE = (
    "test-idp", "agentledger-test-idp", "agentledger-ingress")
SESSION_KEYS = {SESSION_KID: SESSION_PUBLIC}
OPERATOR = "ops:olga"


def session_token(tenant_id: uuid.UUID | str, principal: str,
                  roles: Iterable[str] = ("agent-operator",), *,
                  private_pem: str = SESSION_PRIVATE) -> str:
    """A session token of the test identity provider (``private_pem``: another key, a forgery)."""
    return identity.issue_session(private_pem, SESSION_KID, tenant_id=uuid.UUID(str(tenant_id)),
                                  subject=principal, audience=SESSION_AUDIENCE,
                                  issuer=SESSION_ISSUER, roles=list(roles))


def operator_env(database_url: str, crm_url: str = "http://127.0.0.1:9",
                 lookup_tokens: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """What an operator's shell sets for `reconcile resolve` and `principals`."""
    return {"AGENTLEDGER_DATABASE_URL": database_url,
            "AGENTLEDGER_OPERATOR_SESSION_KEYS": json.dumps(SESSION_KEYS),
            "AGENTLEDGER_OPERATOR_SESSION_ISSUER": SESSION_ISSUER,
            "AGENTLEDGER_OPERATOR_SESSION_AUDIENCE": SESSION_AUDIENCE,
            "AGENTLEDGER_OPERATOR_CRM_URL": crm_url,
            "AGENTLEDGER_OPERATOR_LOOKUP_TOKENS": json.dumps(lookup_tokens or {})}
