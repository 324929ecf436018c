"""The stand-ins of the hostile-provider suite, playing each command's generated plan.

One HTTP stand-in plays every HTTP provider (the CRM and billing APIs, the declared API, the
e-mail search API) and one SMTP stand-in the mail server, for the whole run: each request is
routed by the operation id it carries to its command's :class:`Live` plan, and a truthful
answer (a lookup's found / not found, a fence) is built from what the stand-in recorded
for that key. A third stand-in is where redirects point (another host): it must never hear
a thing.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import agentledger_email

from agentledger.connectors import hostile
from tests.integration.hostile_answers import FOLLOWED, Answer, Plan

SENDER, RECIPIENT = "agent@acme.test", "ada@example.com"
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Live:
    """One command's provider while its example runs: the plan, what was served, what the
    provider did (``applied``: requests whose answer applied them), whether it lied."""

    op: uuid.UUID
    plan: Plan
    target: str
    served: Counter[str] = field(default_factory=Counter)
    seen: Counter[str] = field(default_factory=Counter)
    applied: int = 0
    lied: bool = False
    fenced_answer: bool = False  # a write answered "stale fencing token"


def _pick(answers: Sequence[Any], i: int) -> Any:
    return answers[min(i, len(answers) - 1)] if answers else None


class Provider:
    """The stand-ins, routing each request to its command's plan."""

    def __init__(self) -> None:
        self.live: dict[str, Live] = {}
        self.mail_live: Live | None = None
        self.unrouted = 0
        self.http = hostile.HttpProvider(self._http)
        self.mail = hostile.SmtpProvider(self._smtp)
        self.second = hostile.HttpProvider(lambda _request: hostile.HttpAnswer(
            200, b'{"status": 201, "messages": []}', applies=True))
        self.domain = agentledger_email.deployment_domain("hostile-suite")

    async def start(self) -> None:
        for server in (self.http, self.mail, self.second):
            await server.start()

    async def close(self) -> None:
        for server in (self.http, self.mail, self.second):
            await server.close()

    def accepted(self, op: uuid.UUID, since: int = 0) -> int:
        """Messages with this operation's Message-ID the SMTP stand-in accepted."""
        mark = f"<{agentledger_email.message_id(op, self.domain)}>".encode()
        return sum(mark in m for m in self.mail.messages[since:])

    def _http(self, request: hostile.Request) -> hostile.HttpAnswer:
        key = request.headers.get("idempotency-key") or request.headers.get("fencing-key")
        if key is None and (found := _UUID.search(request.path.encode())):
            key = found.group(0).decode()
        live = self.live.get(key or "")
        if live is None:
            self.unrouted += 1
            return hostile.HttpAnswer(500, b"{}")
        role = {"GET": "lookup", "PUT": "fence"}.get(request.method, "write")
        planned = {"lookup": live.plan.lookups, "fence": live.plan.fences,
                   "write": live.plan.writes}[role]
        answer: Answer | None = _pick(planned, live.seen[role])
        live.seen[role] += 1
        if answer is None:
            self.unrouted += 1
            return hostile.HttpAnswer(500, b"{}")
        live.served[f"{role}: {answer.kind}"] += 1
        if role == "write":
            if answer.definitive and live.applied:
                live.lied = True  # "nothing applied" for a key it applied: undetectable
            live.fenced_answer = b"stale_fencing_token" in answer.http.body
            live.applied += answer.http.applies
        served = self._truthful(live, role, request, answer) if answer.truthful else answer.http
        if answer.location is not None:
            served = replace(served, headers=(("Location", {
                "loopback": f"{self.http.url}{FOLLOWED}{request.path}",
                "second": f"{self.second.url}{request.path}",
                "relative": f"{FOLLOWED}/x", "garbage": "http://[::1"}[answer.location]),
                *served.headers))
        if b"{key}" in served.body[:4096]:
            served = replace(served, body=served.body.replace(b"{key}", str(live.op).encode()))
        return served

    def _truthful(self, live: Live, role: str, request: hostile.Request, answer: Answer
                  ) -> hostile.HttpAnswer:
        op = str(live.op)
        if role == "fence":
            token = request.headers.get("fencing-token", "")
            return hostile.HttpAnswer(200, json.dumps(
                {"fencing_key": op, "token": int(token) if token.isdigit() else 0}).encode())
        if live.plan.connector == "email":
            wanted = agentledger_email.message_id(live.op, self.domain)
            # Look-alikes always: this id from another sender, or of another deployment.
            messages = [{"MessageID": wanted, "From": {"Address": "mallory@evil.test"},
                         "To": [{"Address": live.target}]},
                        {"MessageID": f"{op}@elsewhere.invalid", "From": {"Address": SENDER},
                         "To": [{"Address": live.target}]}]
            if self.accepted(live.op):
                messages.append({"MessageID": wanted, "From": {"Address": SENDER},
                                 "To": [{"Address": live.target}]})
            return hostile.HttpAnswer(200, json.dumps({"messages": messages}).encode())
        if not live.applied:
            return hostile.HttpAnswer(404, b'{"error": {"code": "not_found"}}')
        return hostile.HttpAnswer(200, (
            f'{{"idempotency_key": "{op}", "status": 201, "response": {{"note_id": '
            f'{answer.receipt}, "customer_id": {json.dumps(live.target)}}}}}').encode())

    def _smtp(self) -> hostile.SmtpAnswer:
        live = self.mail_live
        if live is None:
            self.unrouted += 1
            return hostile.SmtpAnswer(codes={"greeting": 554}, accept=False)
        talk = _pick(live.plan.conversations, live.seen["smtp"])
        live.seen["smtp"] += 1
        live.served[f"smtp: {talk.kind}"] += 1
        return talk.smtp  # type: ignore[no-any-return]
