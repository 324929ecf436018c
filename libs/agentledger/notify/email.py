"""The ``email`` notifier: one message per notification over SMTP (Mailpit locally).

``Message-ID: <key@message_id_domain>``: the notification's key, the same on every
redelivery, so a mailbox (or a test reading Mailpit) dedupes by it. The standard library's
``smtplib`` runs in a worker thread, as in the e-mail connector (agentledger-email).

The server's answers are classified here: a 5xx refusal is permanent; a 4xx, a dropped
connection or a timeout is retried by the worker, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import re
import smtplib
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any, ClassVar, Final

from agentledger import errors
from agentledger.notify import plugins

# One SMTP conversation with a local relay takes milliseconds; a stuck one must not hold a
# worker slot for longer than the claim's lease.
DEFAULT_TIMEOUT_S: Final = 10.0
MAX_TIMEOUT_S: Final = 30.0
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$")
_SUBJECT = {"requested": "Approval needed", "escalated": "Approval escalated to you",
            "expired": "Approval expired"}


class EmailNotifier:
    """Sends each notification to the member's e-mail address."""

    contact: ClassVar[plugins.ContactKind] = "email"

    def __init__(self, *, smtp_host: str, smtp_port: int, sender: str, message_id_domain: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.smtp_host, self.smtp_port, self.sender = smtp_host, smtp_port, sender
        self.domain, self.timeout_s = message_id_domain, timeout_s

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> EmailNotifier:
        unknown = sorted(set(options) - {"smtp_host", "smtp_port", "sender",
                                          "message_id_domain", "timeout_s"})
        if unknown:
            raise errors.ConfigurationError(f"email: unknown options {unknown}")
        port = options.get("smtp_port")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise errors.ConfigurationError("email: smtp_port must be a port number")
        sender = options.get("sender")
        if not isinstance(sender, str) or "@" not in sender or len(sender) > 320:
            raise errors.ConfigurationError("email: sender must be an e-mail address")
        domain = options.get("message_id_domain")
        if not isinstance(domain, str) or not _DOMAIN.match(domain):
            raise errors.ConfigurationError(
                "email: message_id_domain must be a lower-case DNS name (the Message-IDs' "
                "own domain)")
        host = options.get("smtp_host", "127.0.0.1")
        timeout = options.get("timeout_s", DEFAULT_TIMEOUT_S)
        if not isinstance(host, str) or not host:
            raise errors.ConfigurationError("email: smtp_host must be a host name")
        if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                or not 0 < timeout <= MAX_TIMEOUT_S):
            # Bounded like the webhook's: a send must end well within the claim's lease.
            raise errors.ConfigurationError(
                f"email: timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}]")
        return cls(smtp_host=host, smtp_port=port, sender=sender, message_id_domain=domain,
                   timeout_s=float(timeout))

    def message_id(self, key: str) -> str:
        """The Message-ID (without angle brackets) a notification with ``key`` carries."""
        return f"{key}@{self.domain}"

    def message(self, n: plugins.Notification) -> EmailMessage:
        m = EmailMessage()
        m["From"] = self.sender
        m["To"] = n.address
        m["Subject"] = f"{_SUBJECT[n.kind]}: {n.action}"
        m["Message-ID"] = f"<{self.message_id(n.key)}>"
        m["Idempotency-Key"] = n.key
        m.set_content(
            f"{_SUBJECT[n.kind]} ({n.group}): {n.action}, needing {n.required_approvals} "
            f"approver(s), open until {n.expires_at.isoformat()}.\n\n"
            f"Review it here: {n.link}\n")
        return m

    async def send(self, notification: plugins.Notification) -> plugins.Delivery:
        message = self.message(notification)
        return await asyncio.to_thread(self._send, message)

    def _send(self, message: EmailMessage) -> plugins.Delivery:
        try:
            with smtplib.SMTP(self.smtp_host, self.smtp_port, timeout=self.timeout_s) as smtp:
                smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            permanent = all(code >= 500 for code in codes)
            return plugins.Delivery("permanent" if permanent else "retry",
                                    f"SMTP refused the recipient ({codes})")
        except smtplib.SMTPResponseException as exc:
            return plugins.Delivery("permanent" if exc.smtp_code >= 500 else "retry",
                                    f"SMTP {exc.smtp_code}")
        except Exception as exc:  # a dropped or stuck server is a retry
            return plugins.Delivery("retry", f"{type(exc).__name__}: no answer")
        return plugins.Delivery("sent", "accepted")

    async def aclose(self) -> None:
        return None


__all__ = ["EmailNotifier"]
