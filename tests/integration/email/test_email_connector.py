"""The e-mail connector, an outside distribution, against a real SMTP server (Mailpit).

Its declared contract is checked for real: a message carries the operation id as its
Message-ID, a lookup finds it, and an answer lost after the server accepted the message is
``InDoubt`` — then settled by the lookup, with exactly one message on the server.
"""

from __future__ import annotations

import smtplib
import uuid
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import agentledger_email
import pytest

from agentledger import errors
from agentledger.connectors import (
    Applied,
    Call,
    InDoubt,
    NotFound,
    NotSent,
    Refused,
    boundary,
    conformance,
    hostile,
    plugins,
)
from tests import mailpit

TENANT = uuid.uuid4()


@pytest.fixture(scope="module")
def server() -> Iterator[mailpit.Mailpit]:
    with mailpit.running("--smtp-allowed-recipients", r"@(example\.com|example\.org)>?$") as found:
        yield found


def options(server: mailpit.Mailpit, port: int | None = None) -> dict[str, object]:
    return {"smtp_host": "127.0.0.1", "smtp_port": port or server.smtp_port,
            "sender": "agent@acme.test", "lookup_url": server.http_url, "timeout_s": 5,
            "recipient_domains": ["example.com"], "deployment_id": "email-tests"}


def call(to: str = "ada@example.com", subject: str = "Your refund") -> Call:
    return Call(TENANT, uuid.uuid4(), "email.send", to,
                {"subject": subject, "body": "It is on its way.\n.\nRegards"}, None)


def mid(c: Call) -> str:
    """The Message-ID this deployment's connector gives the call's message."""
    return agentledger_email.message_id(c.operation_id, agentledger_email.deployment_domain(
        "email-tests"))


def plant(server: mailpit.Mailpit, message_id: str, *, sender: str = "agent@acme.test",
          to: str = "ada@example.com") -> None:
    """Put a message into Mailpit directly over SMTP, as anyone who can reach it could."""
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = sender, to, "look-alike"
    message["Message-ID"] = f"<{message_id}>"
    message.set_content("not ours")
    with smtplib.SMTP("127.0.0.1", server.smtp_port, timeout=10) as smtp:
        smtp.send_message(message)


def make(server: mailpit.Mailpit, port: int | None = None):  # type: ignore[no-untyped-def]
    return plugins.load({"email": options(server, port)})["email"]


async def test_a_sent_message_carries_the_operation_id_and_is_found_by_lookup(
    server: mailpit.Mailpit,
) -> None:
    connector = make(server)
    c = call()
    try:
        sent = await connector.execute(c, "")
        assert sent == Applied(receipt=f"email:{mid(c)}")
        held = server.messages(mid(c))
        assert len(held) == 1
        assert held[0]["Subject"] == "Your refund"
        assert [t["Address"] for t in held[0]["To"]] == ["ada@example.com"]  # type: ignore[index]
        assert await connector.lookup(c, "") == sent
        assert isinstance(await connector.lookup(call(), ""), NotFound)  # never sent
    finally:
        await connector.aclose()


async def test_an_answer_lost_after_acceptance_is_in_doubt_and_the_lookup_settles_it(
    server: mailpit.Mailpit,
) -> None:
    proxy = mailpit.AnswerLost(server.smtp_port)
    connector = make(server, proxy.port)
    c = call(subject="Lost answer")
    try:
        sent = await connector.execute(c, "")
        assert proxy.dropped == 1  # the server accepted it, and its answer was dropped
        assert isinstance(sent, InDoubt), sent
        assert len(server.messages(mid(c))) == 1
        assert await connector.lookup(c, "") == Applied(
            receipt=f"email:{mid(c)}")
    finally:
        proxy.close()
        await connector.aclose()


async def test_a_lookup_never_takes_a_look_alike_for_the_effect(server: mailpit.Mailpit) -> None:
    # Issue 38 class 5: on 85a9f05 any message whose Message-ID was <operation id>@agentledger
    # settled the lookup, whoever sent it to whomever — and the domain was every deployment's.
    connector = make(server)
    c = call()
    try:
        plant(server, f"{c.operation_id}@agentledger")  # the old, shared domain
        plant(server, mid(c), sender="mallory@evil.test")  # our id, another sender
        plant(server, mid(c), to="eve@example.com")  # our id and sender, another recipient
        plant(server, agentledger_email.message_id(  # our id, another deployment's domain
            c.operation_id, agentledger_email.deployment_domain("another-deployment")))
        assert len(server.messages(mid(c))) == 2  # the two with our id are in the store...
        found = await connector.lookup(c, "")
        assert isinstance(found, NotFound), found  # ...and neither is this operation's effect
        plant(server, mid(c))  # the real thing: our id, our sender, its recipient
        assert await connector.lookup(c, "") == Applied(receipt=f"email:{mid(c)}")
    finally:
        await connector.aclose()


async def test_a_refused_recipient_and_an_unreachable_server_send_nothing(
    server: mailpit.Mailpit,
) -> None:
    connector = make(server)
    c = call(to="eve@elsewhere.test")
    try:
        refused = await connector.execute(c, "")
        assert isinstance(refused, Refused) and refused.status >= 500, refused
        assert server.messages(mid(c)) == []
    finally:
        await connector.aclose()
    nowhere = make(server, mailpit.free_port())  # nothing listens there
    try:
        assert isinstance(await nowhere.execute(call(), ""), NotSent)
    finally:
        await nowhere.aclose()


@pytest.mark.parametrize(("reply", "accepted", "expected"), [
    ({"garbage_at": "END"}, True, InDoubt),  # a reply line that is not SMTP
    ({"codes": {"END": 354}}, True, InDoubt),  # neither an acceptance nor a refusal
    ({"codes": {"END": 199}}, True, InDoubt),
    ({"codes": {"END": 999}}, True, InDoubt),
    ({"codes": {"END": 252}}, True, Applied),  # a 2xx is a positive completion
    ({"codes": {"END": 451}}, False, NotSent),  # 4xx: not accepted, try again later
    ({"codes": {"END": 554}}, False, Refused),  # 5xx: not accepted
])
async def test_only_a_refusal_after_the_data_says_the_message_was_not_accepted(
    reply: dict[str, Any], accepted: bool, expected: type,
) -> None:
    # Found by the hostile-provider suite (issue 38 §5): on bff1e25 any reply to the data but
    # 250 was a refusal, so a server that accepted the message and then answered a garbled
    # line (or another 2xx) had the command recorded `denied` — with the message delivered.
    async with hostile.smtp(lambda: hostile.SmtpAnswer(accept=accepted, **reply)) as mail:
        connector = plugins.load({"email": {
            "smtp_host": mail.host, "smtp_port": mail.port, "sender": "agent@acme.test",
            "lookup_url": "http://127.0.0.1:1", "deployment_id": "email-tests"}})["email"]
        try:
            sent = await boundary.execute(connector, call(), "", bound_s=30)
        finally:
            await connector.aclose()
        assert len(mail.messages) == int(accepted)
    assert isinstance(sent, expected), sent


async def test_the_resolver_admits_recipients_of_the_configured_domains_only(
    server: mailpit.Mailpit,
) -> None:
    routed = plugins.resolver({"email": options(server)}, {"email": {str(TENANT): "read"}})
    found = await routed.resolve(TENANT, "email", "ada@example.com")
    assert (found.resource_id, found.revision) == ("ada@example.com", None)
    for target in ("eve@elsewhere.test", "ada@example.com\r\nBcc: x@example.com",
                   "not-an-address", "a@b@example.com"):
        with pytest.raises(errors.ResourceNotFound):
            await routed.resolve(TENANT, "email", target)
    with pytest.raises(errors.ResourceNotFound):  # a tenant without a read token: nothing
        await routed.resolve(uuid.uuid4(), "email", "ada@example.com")


async def test_the_conformance_kit_finds_mailpit_keeps_the_declared_contract(
    server: mailpit.Mailpit, connector_conformance: Any,
) -> None:
    connector = make(server)

    async def from_another_sender(c: Call) -> None:
        plant(server, mid(c), sender="mallory@evil.test", to=c.resource_id)

    async def in_the_shared_domain(c: Call) -> None:
        plant(server, f"{c.operation_id}@agentledger", to=c.resource_id)

    try:
        found = await connector_conformance(conformance.Endpoint(
            connector=connector, tenant_id=TENANT, write_token="", lookup_token="",
            sample=conformance.Sample("email.send", "ada@example.com",
                                      {"subject": "Conformance", "body": "once"}),
            retarget=lambda t: plugins.make("email", plugins.retargeted(
                options(server), http_url=t.http_url, smtp_host=t.smtp_host,
                smtp_port=t.smtp_port)),
            lookalikes=(from_another_sender, in_the_shared_domain)))
    finally:
        await connector.aclose()
    assert {f.claim: f.holds for f in found} == {
        "applies": True, "lookup_finds": True, "lookup_not_found": True,
        "dedupes": None, "if_match": None, "fencing": None,  # `none`: never resent
        "lookup_ignores_lookalike": True, "answers": True}
    lookalike = next(f for f in found if f.claim == "lookup_ignores_lookalike")
    assert "from_another_sender" in lookalike.detail and "in_the_shared_domain" in lookalike.detail
