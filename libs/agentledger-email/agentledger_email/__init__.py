"""``email.send`` over SMTP: an agentledger connector packaged outside the library.

SMTP has no idempotency key, so the contract is ``none``: a message is never sent twice. It
declares ``lookup`` too. The operation id is the local part of the message's ``Message-ID``,
its domain this deployment's own (``message_id_domain``, or one derived from
``deployment_id``), and the provider's search API finds a message whose answer was lost. A
lost answer therefore ends ``succeeded`` (found) or stays ``unknown`` (not found), never as a
second message. SMTP cannot be fenced nor refuse a late message: the contract declares
neither, and an operator's resolution while a send may still land is provisional.

A lookup proves the effect is ours (R14.3): whoever can put a message into the searched
store must not turn a lost send into ``succeeded``. So a found message counts only with this
operation's exact Message-ID in this deployment's domain, from this connector's sender, to
the command's recipient; anything else (a look-alike, a message of another deployment, an
answer that is not the search API's shape) is no evidence.

What a send can come back with, by the SMTP step that failed:
- before ``DATA``: nothing was accepted. A 4xx answer or a broken connection is
  ``NotSent`` (safe to try again), and a 5xx answer is ``Refused``;
- during or after ``DATA``: the server may have accepted the message before the answer was
  lost, so it is ``InDoubt``, and the reconciler's lookup settles it — and so is a reply to
  the data that is neither a 2xx (accepted) nor a 4xx or 5xx (not accepted): a garbled line
  or a code that means nothing there says nothing about the message.

The stdlib's ``smtplib`` runs in a worker thread. It gives each SMTP step as its own call,
which is exactly what the classification needs, and a send is one short conversation.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import smtplib
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from typing import Any
from uuid import UUID

import aiohttp

from agentledger import errors, httpclient
from agentledger.connectors import (
    Applied,
    Call,
    Contract,
    InDoubt,
    Lookup,
    NotFound,
    NotSent,
    Refused,
    Result,
    Scope,
)
from agentledger.resources import Resource, not_found

ACTION = "email.send"
DEFAULT_TIMEOUT_S = 5.0
# One send is connect, EHLO, MAIL, RCPT, DATA (and QUIT): each bounded by the timeout.
STEPS = 6
_ADDRESS = re.compile(r"^[^@\s<>,;:\"\\]{1,64}@([A-Za-z0-9.-]{1,253})$")
_DOMAIN = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                     r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$")


def deployment_domain(deployment_id: str) -> str:
    """The Message-ID domain of a deployment: distinct per deployment, under ``.invalid``
    (RFC 2606: never a real host)."""
    return f"{hashlib.sha256(deployment_id.encode()).hexdigest()[:20]}.agentledger.invalid"


def message_id(operation_id: UUID, domain: str) -> str:
    """The Message-ID a command's e-mail carries, without angle brackets."""
    return f"{operation_id}@{domain}"


class EmailConnector:
    """Sends ``email.send`` commands over SMTP; looks messages up by Message-ID."""

    name = "email"
    actions = frozenset({ACTION})
    scopes: frozenset[Scope] = frozenset({"write", "lookup"})

    def __init__(self, *, smtp_host: str, smtp_port: int, sender: str, lookup_url: str,
                 message_id_domain: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.smtp_host, self.smtp_port, self.sender = smtp_host, smtp_port, sender
        self.lookup_url, self.timeout_s = lookup_url.rstrip("/"), timeout_s
        if not _DOMAIN.match(message_id_domain):
            raise errors.ConfigurationError(
                f"the email connector's message_id_domain {message_id_domain!r} is not a "
                "domain name", connector="email")
        self.domain = message_id_domain
        self.contract = Contract("none", lookup=True, call_timeout_s=timeout_s * STEPS)
        self._session: aiohttp.ClientSession | None = None

    async def execute(self, call: Call, token: str) -> Result:
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = call.resource_id  # the target, resolved at admission
        message["Subject"] = str(call.arguments["subject"])
        message["Message-ID"] = f"<{message_id(call.operation_id, self.domain)}>"
        message.set_content(str(call.arguments["body"]))
        return await asyncio.to_thread(self._send, message, call.resource_id)

    def _send(self, message: EmailMessage, recipient: str) -> Result:
        step = "connect"
        try:
            with smtplib.SMTP(self.smtp_host, self.smtp_port, timeout=self.timeout_s) as smtp:
                step = "EHLO"
                _check(*smtp.ehlo(), step)
                step = "MAIL"
                _check(*smtp.mail(self.sender), step)
                step = "RCPT"
                _check(*smtp.rcpt(recipient), step)
                step = "DATA"  # from here on, the server may accept before we hear it
                code, answer = smtp.data(message.as_bytes())
                if not 200 <= code < 300:
                    return _after_data(code, answer)
                receipt = f"email:{message_id_of(message)}"
                try:
                    smtp.quit()
                except (smtplib.SMTPException, OSError):
                    pass  # accepted is accepted; the goodbye does not matter
                return Applied(receipt=receipt)
        except _Answered as refused:
            return refused.result
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            if step == "DATA":
                return InDoubt(f"no answer after DATA: {type(exc).__name__}")
            return NotSent(f"SMTP {step} failed before DATA: {type(exc).__name__}")

    async def lookup(self, call: Call, token: str) -> Lookup:
        wanted = message_id(call.operation_id, self.domain)
        try:
            async with self._client().get(
                    f"{self.lookup_url}/api/v1/search",
                    params={"query": f"message-id:{wanted}"}, allow_redirects=False,
                    headers={"Authorization": f"Bearer {token}"} if token else {}) as answer:
                if answer.status != 200:
                    return InDoubt(f"the search API answered {answer.status}")
                body, truncated = await httpclient.read_body(answer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return InDoubt(f"no answer from the search API: {type(exc).__name__}")
        found = None if truncated else httpclient.Answer(200, {}, body).json_object()
        messages = found.get("messages") if found is not None else None
        if not isinstance(messages, list):
            return InDoubt("the search API's answer is not a list of messages")
        if any(self._ours(m, wanted, call.resource_id) for m in messages):
            return Applied(receipt=f"email:{wanted}")
        return NotFound(f"no message with Message-ID {wanted} from {self.sender} to "
                        f"{call.resource_id}")

    def _ours(self, message: object, wanted: str, recipient: str) -> bool:
        """This operation's message: its Message-ID, from our sender, to its recipient."""
        if not isinstance(message, dict) or message.get("MessageID") != wanted:
            return False
        sender = message.get("From")
        to = message.get("To")
        return (isinstance(sender, dict) and _same(sender.get("Address"), self.sender)
                and isinstance(to, list)
                and any(isinstance(t, dict) and _same(t.get("Address"), recipient) for t in to))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Answered(Exception):
    def __init__(self, result: Result) -> None:
        self.result = result


def _check(code: int, answer: bytes, step: str) -> None:
    if not 200 <= code < 300:
        raise _Answered(_refusal(code, answer, step))


def _refusal(code: int, answer: bytes, step: str) -> Result:
    text = answer.decode(errors="replace")[:200]
    if 400 <= code < 500:  # "try again later": nothing was accepted
        return NotSent(f"SMTP {step} answered {code}: {text}")
    return Refused(f"SMTP {step} answered {code}: {text}", status=code)


def _after_data(code: int, answer: bytes) -> Result:
    """The reply to the data when it is no acceptance: only a 4xx or 5xx says the message
    was not accepted; anything else (a garbled line, a 1xx, 3xx or unknown code) says
    nothing about it, and the server may have kept it."""
    if 400 <= code < 600:
        return _refusal(code, answer, "DATA")
    return InDoubt(f"SMTP DATA answered {code}, neither an acceptance nor a refusal: the "
                   "message may have been accepted")


def message_id_of(message: EmailMessage) -> str:
    return str(message["Message-ID"]).strip("<>")


def _same(address: object, wanted: str) -> bool:
    return isinstance(address, str) and address.strip().lower() == wanted.strip().lower()


class RecipientResolver:
    """Admission's check of a target (R1.4): an address in the configured domains, for a
    tenant this deployment holds a read token for. E-mail has no revisions."""

    def __init__(self, domains: Sequence[str], read_tokens: Mapping[str, str]) -> None:
        self.domains = frozenset(d.lower() for d in domains)
        self.tenants = frozenset(read_tokens)

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        matched = _ADDRESS.match(resource_id)
        if (str(tenant_id) not in self.tenants or matched is None
                or matched.group(1).lower() not in self.domains):
            raise not_found(resource_id)
        return Resource(connector, resource_id, None)


def connector(options: Mapping[str, Any]) -> EmailConnector:
    """Entry point ``email`` of group ``agentledger.connectors``."""
    domain = options.get("message_id_domain")
    if domain is None and isinstance(options.get("deployment_id"), str):
        domain = deployment_domain(options["deployment_id"])
    if not isinstance(domain, str):
        raise errors.ConfigurationError(
            "the email connector needs message_id_domain (its Message-IDs' own domain) or "
            "deployment_id (one is derived): a lookup must not find another deployment's "
            "messages", connector="email")
    try:
        return EmailConnector(
            smtp_host=str(options["smtp_host"]), smtp_port=int(options["smtp_port"]),
            sender=str(options["sender"]), lookup_url=str(options["lookup_url"]),
            message_id_domain=domain, timeout_s=float(options.get("timeout_s", DEFAULT_TIMEOUT_S)))
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.ConfigurationError(
            f"the email connector needs smtp_host, smtp_port, sender, lookup_url: {exc!r}"
        ) from exc


def resolver(options: Mapping[str, Any], read_tokens: Mapping[str, str]) -> RecipientResolver:
    """Entry point ``email`` of group ``agentledger.resolvers``."""
    domains = options.get("recipient_domains")
    if not isinstance(domains, list) or not domains:
        raise errors.ConfigurationError("the email connector needs recipient_domains: a list")
    return RecipientResolver(domains, read_tokens)


__all__ = ["EmailConnector", "RecipientResolver", "connector", "deployment_domain", "message_id",
           "resolver"]
