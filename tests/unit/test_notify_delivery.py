"""The pure parts of notification delivery (issue 42): how an answer is classified, how a
webhook is signed, how long a retry waits, and that a notification's key is stable."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from datetime import timedelta

import pytest

from agentledger.notify import outbox, webhook, worker


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "sent"), (202, "sent"), (204, "sent"),
    (301, "retry"), (302, "retry"), (307, "retry"),  # a redirect is never followed
    (400, "permanent"), (401, "permanent"), (404, "permanent"), (410, "permanent"),
    (408, "retry"), (429, "retry"),
    (500, "retry"), (502, "retry"), (503, "retry"), (599, "retry"), (100, "retry"),
])
def test_a_receivers_status_is_classified_in_one_place(status: int, outcome: str) -> None:
    assert webhook.classify(status).outcome == outcome


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    secret, stamp, body = b"k" * 32, "1700000000", b'{"key":"x"}'
    expected = hmac.new(secret, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert webhook.signature(secret, stamp, body) == "v1=" + expected
    assert webhook.signature(secret, "1700000001", body) != "v1=" + expected
    assert webhook.signature(b"j" * 32, stamp, body) != "v1=" + expected


def test_backoff_doubles_from_two_seconds_and_is_capped() -> None:
    assert [worker.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert worker.backoff(50) == worker.BACKOFF_CAP == timedelta(minutes=5)
    assert worker.backoff(1, jitter=0.2) == timedelta(seconds=2.4)


def test_the_key_is_stable_and_distinct_per_recipient_channel_and_kind() -> None:
    approval = uuid.UUID("8a2f6c1e-6f1e-4c55-9d4f-0c2d7f0e9b11")
    key = outbox.key(approval, "user:fiona", "hook", "requested")
    assert key == outbox.key(approval, "user:fiona", "hook", "requested")
    others = {outbox.key(approval, "user:frank", "hook", "requested"),
              outbox.key(approval, "user:fiona", "mail", "requested"),
              outbox.key(approval, "user:fiona", "hook", "escalated"),
              outbox.key(uuid.uuid4(), "user:fiona", "hook", "requested")}
    assert key not in others and len(others) == 4


def test_the_link_is_the_consoles_page_of_the_request() -> None:
    approval = uuid.uuid4()
    assert outbox.link("https://console.example.com/", approval) == (
        f"https://console.example.com/approvals/{approval}")


@pytest.mark.parametrize("timeout", [0, -1, 30.5, 600, True, "5"])
def test_an_email_timeout_beyond_the_bound_is_refused(timeout: object) -> None:
    """A send must end well within the claim's lease, as the webhook's does."""
    from agentledger import errors
    from agentledger.notify import email

    options = {"smtp_port": 1025, "sender": "a@b.example", "message_id_domain": "b.example",
               "timeout_s": timeout}
    with pytest.raises(errors.ConfigurationError, match="timeout_s"):
        email.EmailNotifier.from_options(options)
    assert email.EmailNotifier.from_options({**options, "timeout_s": 30}).timeout_s == 30.0
