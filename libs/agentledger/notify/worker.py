"""The notifier's loop: claim due notifications, send each through its channel, mark it.

Invariant: a row is marked ``sent`` only after its plugin said the receiver accepted it, and
a claim is a lease, so a worker killed between the send and the mark (fault point
``notifier.after_send``) leaves the row pending; when the lease passes another worker (or
this one restarted) sends it again, with the same key. Receivers dedupe by the key.

A ``requested`` or ``escalated`` notice whose request closed before it went out (decided,
superseded, expired) is ``cancelled``, not sent: nobody is asked to decide what is closed.

An attempt the plugin classifies ``retry`` is claimable again after an exponential backoff;
after ``max_attempts`` claims, or on a ``permanent`` answer, the row is ``failed`` with an
audit event and a metric: never an unbounded retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import asyncpg

from agentledger import faults
from agentledger.notify import escalation, outbox, plugins
from agentledger.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

# Long enough for every send of a claimed batch to finish (a plugin's own timeout is at most
# 30 s); short enough that a killed worker's rows are delivered within a minute.
DEFAULT_LEASE: Final = timedelta(seconds=45)
# Ten attempts with the backoff below span about 17 minutes: a receiver down for a deploy is
# reached, one gone for good is reported failed the same quarter hour.
DEFAULT_MAX_ATTEMPTS: Final = 10
# The first retry after 2 s, doubling, capped at 5 minutes (a receiver that recovers is not
# left waiting longer than that).
BACKOFF_BASE: Final = timedelta(seconds=2)
BACKOFF_CAP: Final = timedelta(minutes=5)


def system_clock() -> datetime:
    return datetime.now(UTC)


def backoff(attempts: int, *, base: timedelta = BACKOFF_BASE, cap: timedelta = BACKOFF_CAP,
            jitter: float = 0.0) -> timedelta:
    """The wait after the ``attempts``-th failed attempt (1-based): base x 2^(n-1), capped,
    plus up to ``jitter`` of itself (so receivers that failed together are not retried
    together)."""
    wait: timedelta = min(base * (2 ** max(0, min(attempts - 1, 30))), cap)
    return wait + wait * jitter


@dataclass
class Notifier:
    """One notifier worker over a pool, a set of channels and a clock (the tests' seam)."""

    pool: asyncpg.Pool
    channels: Mapping[str, plugins.Notifier]
    plugin_of: Mapping[str, str]  # channel name -> plugin name (metrics)
    console_url: str
    worker_id: str
    lease: timedelta = DEFAULT_LEASE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch: int = 50
    clock: Clock = system_clock
    # Escalation and expiry notices (agentledger.notify.escalation); None: only deliveries.
    router: outbox.Router | None = None

    async def sweep(self) -> int:
        """Escalate the requests whose window passed and announce the expired ones (at this
        notifier's clock); returns how many requests it acted on."""
        if self.router is None:
            return 0
        now = self.clock()
        async with self.pool.acquire() as conn:
            escalated = await escalation.escalate_due(conn, self.router, now=now)
            expired = await escalation.announce_expired(conn, self.router, now=now)
        for approval_id in escalated:
            log.info("event=approval_escalated approval_id=%s", approval_id)
        return len(escalated) + len(expired)

    async def run_once(self) -> int:
        """Claim one batch and settle every row of it; returns how many were claimed."""
        async with self.pool.acquire() as conn:
            claimed = await outbox.claim(conn, worker=self.worker_id, now=self.clock(),
                                         lease=self.lease, limit=self.batch)
        if claimed:
            await asyncio.gather(*(self._deliver(c) for c in claimed))
        return len(claimed)

    async def _deliver(self, c: outbox.Claimed) -> None:
        if c.moot:
            async with self.pool.acquire() as conn:
                await outbox.cancel(conn, c)
            log.info("event=notification_cancelled key=%s approval_id=%s request_state=%s",
                     c.key, c.approval_id, c.request_state)
            return
        channel = self.channels.get(c.channel)
        plugin = self.plugin_of.get(c.channel, "unknown")
        if channel is None:
            delivery = plugins.Delivery("permanent", f"channel {c.channel} is not configured")
        elif c.attempts > self.max_attempts:
            # Claimed more often than allowed without a settled attempt (a worker killed or a
            # plugin that crashed it each time): failed, never an endless claim.
            delivery = plugins.Delivery("permanent", f"{c.attempts - 1} attempts never settled")
        else:
            delivery = await _send(channel, c.notification(self.console_url))
        await faults.point("notifier.after_send")
        async with self.pool.acquire() as conn:
            if delivery.outcome == "sent":
                marked = await outbox.mark_sent(conn, c, now=self.clock())
                outcome = "sent"
            elif delivery.outcome == "retry" and c.attempts < self.max_attempts:
                until = self.clock() + backoff(c.attempts, jitter=random.random() * 0.2)  # noqa: S311 - jitter, not crypto
                marked = await outbox.back_off(conn, c, until=until, error=delivery.detail)
                outcome = "retry"
            else:
                marked = await outbox.mark_failed(conn, c, error=delivery.detail)
                outcome = "failed"
        telemetry_metrics.notifications.add(1, connector=telemetry_metrics.bounded(plugin),
                                            outcome=outcome)
        log.log(logging.WARNING if outcome == "failed" else logging.INFO,
                "event=notification_%s key=%s approval_id=%s channel=%s attempts=%d "
                "marked=%s detail=%s", outcome, c.key, c.approval_id, c.channel, c.attempts,
                marked, delivery.detail)


async def _send(channel: plugins.Notifier, n: plugins.Notification) -> plugins.Delivery:
    """A plugin's send, which must never raise: a plugin is third-party code, and one that
    raises is an attempt to retry within the bound, not the end of the worker."""
    try:
        return await channel.send(n)
    except Exception as exc:  # any plugin failure is one failed attempt
        return plugins.Delivery("retry", f"the plugin raised {type(exc).__name__}")


__all__ = ["DEFAULT_LEASE", "DEFAULT_MAX_ATTEMPTS", "Notifier", "backoff", "system_clock"]
