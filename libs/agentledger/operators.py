"""Who runs an operator command: a verified session of a current operator (issue 18 §3).

Operator commands (``reconcile resolve``, ``principals …``) record who acted. That name comes
only from a session token verified here — the same tokens ingress and the console accept,
from the same identity provider — never from a free-text option. Like the console's approvers,
an operator passes two checks: the token's ``roles`` claim names an operating role (what the
identity provider said when it issued the token), and the principal directory, read at each
command, says so now (:func:`agentledger.policy.repository.require_operator`): revoking the
principal or its role in the directory stops its unexpired tokens at the next command.

The settings below are what an operator's shell needs besides the ledger's URL: the identity
provider's public keys, and the lookup side of the connectors, so a resolution's receipt is
checked with the provider wherever the provider can be asked.
"""

from __future__ import annotations

import uuid

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import errors, identity, settings
from agentledger.connectors import base, plugins
from agentledger.policy import repository as policy_repo


class OperatorSettings(BaseSettings):
    """Operator commands' settings (env prefix ``AGENTLEDGER_OPERATOR_``)."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_OPERATOR_", extra="ignore")

    # The identity provider's public keys as JSON {kid: PEM}, its issuer and the audience of
    # its session tokens: the values the console and ingress are configured with. Unset, every
    # operator command is refused (fail closed), never run unauthenticated.
    session_keys: dict[str, str] = Field(default_factory=dict)
    session_issuer: str = ""
    session_audience: str = "agentledger-ingress"
    # The providers' base URL and {connector: {tenant id: lookup-scoped token}}, as the
    # reconciler has them: a resolution is checked with the lookup the reconciler would use.
    crm_url: str = "http://127.0.0.1:8090"
    connectors_options: settings.ConnectorOptions = None
    lookup_tokens: dict[str, dict[str, str]] = Field(default_factory=dict)

    def credentials(self) -> base.Credentials:
        """The lookup credentials (never a write token: an operator command sends nothing)."""
        return base.Credentials("lookup", self.lookup_tokens)

    def connectors(self) -> dict[str, base.Connector]:
        """The deployment's connectors by name, as the reconciler builds them (close them
        after)."""
        return plugins.load(plugins.configured(self.connectors_options, self.crm_url))


def verify(token: str | None, cfg: OperatorSettings, *, tenant_id: uuid.UUID | None = None
           ) -> identity.Session:
    """The verified session of an operator command's caller.

    Only the token's claims are checked here; the directory decides at each command
    (:func:`agentledger.policy.repository.require_operator`).

    Args:
        token: The compact JWS session token.
        cfg: Where the identity provider's keys come from.
        tenant_id: The tenant the caller named, if any: it must be the session's.

    Raises:
        errors.IdentityRejected: No keys configured, no token, a token that does not verify,
            or a session of another tenant than ``tenant_id``.
        errors.NotAnOperator: The token verifies but claims no operating role.
    """
    if not cfg.session_keys or not cfg.session_issuer:
        raise errors.IdentityRejected(
            "no identity provider configured: set AGENTLEDGER_OPERATOR_SESSION_KEYS and "
            "AGENTLEDGER_OPERATOR_SESSION_ISSUER (the console's session keys and issuer)")
    if not token:
        raise errors.IdentityRejected("no session token: pass --token or set AGENTLEDGER_TOKEN")
    session = identity.verify_session(token, identity.KeySet.from_pem(cfg.session_keys),
                                      audience=cfg.session_audience, issuer=cfg.session_issuer)
    if tenant_id is not None and tenant_id != session.tenant_id:
        raise errors.IdentityRejected("the session is for another tenant than the one named")
    if not policy_repo.OPERATING_ROLES.intersection(session.roles):
        raise errors.NotAnOperator("this session claims no operating role")
    return session
