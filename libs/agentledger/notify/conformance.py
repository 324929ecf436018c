"""The notifier claim beside the connector conformance kit: does a plugin keep the key?

A receiver dedupes notifications by their key (webhook ``Idempotency-Key``, e-mail
``Message-ID``), so a plugin must carry the key where the receiver sees it and carry the
*same* key when the outbox redelivers (after a worker was killed between the send and the
mark). The kit sends a sample notification twice through the plugin, for real, and asks the
receiver (``seen``: what it recorded under a key) what arrived:

- ``delivers``: the first send is classified ``sent`` and the receiver recorded the key;
- ``same_key_on_redelivery``: the resend is ``sent`` too and the receiver recorded both under
  the one key (so deduping by it keeps one);
- ``distinct_keys``: a notification with another key is recorded under that key, not the
  first (a plugin that sends a constant would make a receiver drop everything after one).

Findings have the shape of the connector kit's (``claim``, ``holds``, ``detail``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentledger.notify import plugins


@dataclass(frozen=True)
class Finding:
    """One claim: ``holds`` True or False, and what was seen."""

    claim: str
    holds: bool
    detail: str


# What the receiver recorded under a key: one entry per delivery that carried it.
Seen = Callable[[str], Awaitable[int]]
Settle = Callable[[Callable[[], Awaitable[bool]]], Awaitable[bool]]


async def check(notifier: plugins.Notifier, sample: plugins.Notification, seen: Seen,
                settle: Settle) -> list[Finding]:
    """Run the three claims; ``settle(condition)`` waits (with a deadline) until a condition
    about the receiver holds (an SMTP server stores a message after it answered)."""
    findings: list[Finding] = []
    first = await notifier.send(sample)
    got_first = await settle(lambda: _at_least(seen, sample.key, 1))
    findings.append(Finding("delivers", first.outcome == "sent" and got_first,
                            f"{first.outcome}: {first.detail}; recorded={got_first}"))
    again = await notifier.send(sample)
    got_again = await settle(lambda: _at_least(seen, sample.key, 2))
    findings.append(Finding("same_key_on_redelivery", again.outcome == "sent" and got_again,
                            f"{again.outcome}: {again.detail}; recorded twice under the "
                            f"key={got_again}"))
    other = dataclasses.replace(sample, key=sample.key + "-other")
    third = await notifier.send(other)
    got_other = await settle(lambda: _at_least(seen, other.key, 1))
    findings.append(Finding("distinct_keys",
                            third.outcome == "sent" and got_other and await seen(sample.key) == 2,
                            f"{third.outcome}: {third.detail}; recorded under its own "
                            f"key={got_other}"))
    return findings


async def _at_least(seen: Seen, key: str, n: int) -> bool:
    return await seen(key) >= n


__all__ = ["Finding", "Seen", "Settle", "check"]
