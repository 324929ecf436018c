"""The routing file the notification tests share: finance (fiona, frank, fred) asked for a
refund above 500 EUR by signed webhook and e-mail, escalated to leads (lena, leo) by e-mail."""

from __future__ import annotations

from typing import Any

from agentledger.approvals import quorum

SECRET_ENV = "AGENTLEDGER_TEST_WEBHOOK_SECRET"
SECRET = "test-webhook-signing-secret-0123456789"
FINANCE = ("user:fiona", "user:frank", "user:fred")
LEADS = ("user:lena", "user:leo")
DOMAIN = "approvals.agentledger.invalid"
REFUND = "billing.refund.create"


def document(*, hook_url: str, smtp_port: int, escalate_after: float | None = None,
             required: int = 2, escalate_to: str = "leads") -> dict[str, Any]:
    """The v2 approval file (``escalate_after`` seconds: with escalation to leads)."""
    rule: dict[str, Any] = {"name": "large-refunds", "action": REFUND,
                            "argument": "amount_minor", "above": 50_000, "group": "finance",
                            "required": required}
    if escalate_after is not None:
        rule |= {"escalate_to": escalate_to, "escalate_after": escalate_after}
    return {
        "format": quorum.ROUTED_FORMAT,
        "channels": {
            "hook": {"plugin": "webhook", "options": {"secret_env": SECRET_ENV}},
            "mail": {"plugin": "email", "options": {
                "smtp_host": "127.0.0.1", "smtp_port": smtp_port,
                "sender": "approvals@agentledger.invalid", "message_id_domain": DOMAIN}}},
        "groups": {
            "finance": {"role": "finance-approver", "members": list(FINANCE),
                        "channels": ["hook", "mail"],
                        "contacts": {m: {"email": f"{m[5:]}@finance.invalid",
                                         "webhook": f"{hook_url}/{m[5:]}"} for m in FINANCE}},
            "leads": {"role": "finance-approver", "members": list(LEADS),
                      "channels": ["mail"],
                      "contacts": {m: {"email": f"{m[5:]}@leads.invalid"} for m in LEADS}}},
        "rules": [rule]}
