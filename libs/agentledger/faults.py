"""Named fault points for chaos tests (STYLE rule 12), a no-op unless configured.

``AGENTLEDGER_FAULT=<point>:<action>[:<count or probability>]``, several separated by commas.
Actions: ``kill`` (SIGKILL this process), ``pause`` (SIGSTOP it: a paused worker past its
lease), ``delay`` (sleep 2 s), ``raise`` (raise FaultInjected). The optional third field is a
count (``3``: the first three passes) or a probability (``0.2``). Points are few and named in
``POINTS``; every one is exercised by a chaos test.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass

POINTS = frozenset({
    "admission.before_commit",
    "batch.mid_publish",               # half of a batch's answers produced, the rest not yet
    "batch.before_offset_commit",      # every answer delivered, the offsets not committed
    "executor.after_claim",            # after commit, before dispatch
    "groupcommit.before_commit",       # a group's units (or one set-based statement's rows)
                                       # all written, its one COMMIT not sent
    "executor.before_call",            # after the pre-call check, before the request leaves
    "executor.after_remote_write",     # after the remote write, before the receipt is persisted
    "executor.after_receipt",          # after the receipt, before the queue ack
    "relay.after_produce",             # after produce, before the LSN flush
    "relay.after_sweep",               # acknowledged rows deleted, their LSN not yet flushed
    "relay.after_slot_created",        # slot created, its pre-slot rows not yet published
    "reconciler.mid_lookup",
    "notifier.after_send",             # a notification delivered, its row not yet marked sent
})


class FaultInjected(RuntimeError):
    """Raised by the ``raise`` action."""


@dataclass
class _Rule:
    action: str
    remaining: int | None
    probability: float | None

    def fires(self) -> bool:
        if self.probability is not None:
            return random.random() < self.probability  # noqa: S311 - chaos, not crypto
        if self.remaining is None:
            return True
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True


def _parse(spec: str) -> dict[str, _Rule]:
    rules: dict[str, _Rule] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, rest = item.partition(":")
        action, _, amount = rest.partition(":")
        if point not in POINTS or action not in ("kill", "pause", "delay", "raise"):
            raise ValueError(f"bad AGENTLEDGER_FAULT entry {item!r}")
        count = prob = None
        if amount:
            if "." in amount:
                prob = float(amount)
            else:
                count = int(amount)
        rules[point] = _Rule(action, count, prob)
    return rules


_RULES = _parse(os.environ.get("AGENTLEDGER_FAULT", ""))


def _fire(name: str) -> str | None:
    """Apply kill / pause / raise; return "delay" for the caller to wait, else None."""
    rule = _RULES.get(name)
    if rule is None or not rule.fires():
        return None
    if rule.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif rule.action == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif rule.action == "raise":
        raise FaultInjected(name)
    return rule.action


# A delay long enough to push a worker past short test leases, short enough for CI.
DELAY_S = 2.0


async def point(name: str) -> None:
    """Pass a named fault point; does nothing unless AGENTLEDGER_FAULT names it."""
    if _RULES and _fire(name) == "delay":
        await asyncio.sleep(DELAY_S)


def point_sync(name: str) -> None:
    """The same, for the relay's replication thread."""
    if _RULES and _fire(name) == "delay":
        time.sleep(DELAY_S)


def reload(spec: str | None = None) -> None:
    """Re-read the configuration (tests that set the variable after import)."""
    global _RULES
    _RULES = _parse(os.environ.get("AGENTLEDGER_FAULT", "") if spec is None else spec)
