"""A connector from outside the library, end to end: ``email.send`` through admission, the
relay and an executor of its own, against a real SMTP server (Mailpit).

The operator's configuration is what a team would write: the packaged allowlist and policies
plus the e-mail distribution's entry and policy, read from AGENTLEDGER_ALLOWLIST and
AGENTLEDGER_POLICY_DIR; the connector is found by its entry point (AGENTLEDGER_CONNECTORS
names it). SMTP has no idempotency key: an answer lost after the server accepted the message
leaves the command ``unknown``, and the reconciler's lookup by Message-ID settles it as
``succeeded`` — one message, never two.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import agentledger_email
import psycopg2
import pytest

from agentledger.connectors import plugins
from agentledger.policy import allowlist, cedar
from agentledger.policy import check as check_mod
from agentledger.testing.pipeline import Pipeline, pipeline
from tests import mailpit
from tests.stack import Stack


def mid(op: object) -> str:
    """The Message-ID the pipeline's e-mail connector (deployment ``email-e2e``) gives op."""
    return agentledger_email.message_id(uuid.UUID(str(op)),
                                        agentledger_email.deployment_domain("email-e2e"))

def operator_config(where: Path) -> dict[str, str]:
    """The packaged allowlist and policies, plus what agentledger-email ships."""
    package = resources.files("agentledger_email")
    rules = json.loads(allowlist.DEFAULT_PATH.read_text())
    rules["actions"] += json.loads(package.joinpath("allowlist.json").read_text())["actions"]
    (where / "allowlist.json").write_text(json.dumps(rules))
    shutil.copytree(cedar.DEFAULT_DIR, where / "policies")
    (where / "policies" / "30_email.cedar").write_text(
        package.joinpath("policies", "30_email.cedar").read_text())
    return {"AGENTLEDGER_ALLOWLIST": str(where / "allowlist.json"),
            "AGENTLEDGER_POLICY_DIR": str(where / "policies")}


@dataclass
class World:
    p: Pipeline
    mail: mailpit.Mailpit
    proxy: mailpit.AnswerLost


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    config = operator_config(tmp_path_factory.mktemp("operator"))
    with mailpit.running() as mail:
        proxy = mailpit.AnswerLost(mail.smtp_port, armed=False)
        email = {"smtp_host": "127.0.0.1", "smtp_port": proxy.port, "sender": "agent@acme.test",
                 "lookup_url": mail.http_url, "recipient_domains": ["example.com"],
                 "deployment_id": "email-e2e"}
        try:
            with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                          tmp_path_factory.mktemp("email"), connectors={"email": email},
                          config_env=config) as p:
                yield World(p, mail, proxy)
        finally:
            proxy.close()


def audit_types(p: Pipeline, op: object) -> list[str]:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT type FROM audit_event WHERE operation_id = %s ORDER BY seq",
                        (str(op),))
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def test_the_operators_configuration_checks(world: World, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    config = operator_config(tmp_path)
    email = {"smtp_host": "127.0.0.1", "smtp_port": 1, "sender": "a@acme.test",
             "lookup_url": "http://127.0.0.1:1", "recipient_domains": ["example.com"],
             "deployment_id": "email-e2e"}
    report = check_mod.check(Path(config["AGENTLEDGER_ALLOWLIST"]),
                             Path(config["AGENTLEDGER_POLICY_DIR"]),
                             {**plugins.defaults("http://127.0.0.1:1"), "email": email})
    assert report.ok, report.problems
    assert report.connectors["email"]["idempotency"] == "none"
    assert report.connectors["email"]["lookup"] is True
    assert report.roles["user"]["email.send"] == "allow"
    assert report.roles["approver"]["email.send"] == "deny"


def test_an_email_is_sent_once_with_the_operation_id_as_its_message_id(world: World) -> None:
    op = world.p.propose("email.send", {"subject": "Your refund", "body": "It is on its way."},
                         target="ada@example.com")
    state, receipt = world.p.wait_state(op, "succeeded", "failed", "unknown")
    assert (state, receipt) == ("succeeded", f"email:{mid(op)}")
    held = world.mail.messages(mid(op))
    assert len(held) == 1 and held[0]["Subject"] == "Your refund"
    assert [t["Address"] for t in held[0]["To"]] == ["ada@example.com"]  # type: ignore[index]
    assert audit_types(world.p, op)[-1] == "command.succeeded"


def test_a_recipient_outside_the_configured_domains_is_never_admitted(world: World) -> None:
    op = world.p.propose("email.send", {"subject": "Hello", "body": "x"},
                         target="eve@elsewhere.test")
    answers = world.p.read("agent.admissions.v1", lambda v: v.get("operation_id") == str(op))
    assert [(a["status"], a["reason_code"]) for a in answers] == [
        ("rejected", "resource_not_found")]
    assert world.p.state(op) is None
    assert world.mail.messages(mid(op)) == []


def test_an_answer_lost_after_acceptance_ends_succeeded_through_lookup_with_one_message(
    world: World,
) -> None:
    world.proxy.arm()
    op = world.p.propose("email.send", {"subject": "Lost answer", "body": "once only"},
                         target="bob@example.com")
    state, receipt = world.p.wait_state(op, "succeeded", "failed")
    assert world.proxy.dropped == 1  # the server accepted it; the executor never heard
    assert (state, receipt) == ("succeeded", f"email:{mid(op)}")
    assert len(world.mail.messages(mid(op))) == 1
    types = audit_types(world.p, op)
    assert "command.unknown" in types, types  # the executor did not invent success
    assert types[-1] == "command.succeeded"
    assert types.count("command.claimed") == 2  # the executor's send, the reconciler's lookup
