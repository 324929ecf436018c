"""Who is signed in: session tokens re-verified on every request, and CSRF tokens for forms.

The tenant and the approver come ONLY from a verified session token (R1.1): the page cookie
and the API's bearer header carry the same token ingress accepts, and both are verified
with ``identity.verify_session`` each time, so an expired or re-keyed token stops working
at once. Only holders of an approving role may use the console at all; whether they may
approve a given request is the policy's question, asked when they decide.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

from agentledger import errors, identity
from agentledger.approvals import rules

# A first filter on the token's claims; the directory and Cedar decide (approvals.rules).
APPROVING_ROLES: Final = rules.APPROVING_ROLES
SESSION_COOKIE: Final = "agentledger_console"
# Holds a random value until sign-in, so a cross-site page cannot sign a browser in under
# an attacker's session (login CSRF): the sign-in form must echo it.
PRESESSION_COOKIE: Final = "agentledger_console_pre"


class SignInRequired(Exception):
    """No valid console session: pages redirect to the sign-in form."""


class NotAnApprover(errors.PolicyDenied):
    """The session is valid but carries no approving role."""


class CsrfRejected(errors.PolicyDenied):
    """The form did not carry this session's CSRF token: it did not come from the console."""


@dataclass(frozen=True)
class Gate:
    """Verifies session tokens and derives the per-session CSRF token."""

    keys: identity.KeySet
    issuer: str
    audience: str
    csrf_key: bytes

    @classmethod
    def create(cls, pems: dict[str, str], *, issuer: str, audience: str,
               csrf_secret: str | None) -> Gate:
        key = csrf_secret.encode() if csrf_secret else secrets.token_bytes(32)
        return cls(identity.KeySet.from_pem(pems), issuer, audience, key)

    def verify(self, token: str | None) -> identity.Session:
        """The verified session of an approver.

        Raises:
            errors.IdentityRejected: no token, or it does not verify.
            NotAnApprover: it verifies but carries neither approving role.
        """
        session = identity.verify_session(token, self.keys, audience=self.audience,
                                          issuer=self.issuer)
        if not APPROVING_ROLES.intersection(session.roles):
            raise NotAnApprover("this session carries no approver role")
        return session

    def csrf_token(self, token: str) -> str:
        """The CSRF token of one session: stable for the session, useless for any other."""
        return hmac.new(self.csrf_key, b"csrf\x1f" + token.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, token: str, submitted: str | None) -> bool:
        return submitted is not None and hmac.compare_digest(self.csrf_token(token), submitted)
