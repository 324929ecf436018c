"""The notifier service: polls the notification outbox and sends through notifier plugins."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from agentledger import errors, services
from agentledger import settings as shared
from agentledger.approvals import quorum
from agentledger.notify import outbox, plugins, worker
from agentledger.policy import allowlist
from agentledger.policy import check as policy_check
from agentledger.services.notifier.settings import NotifierSettings

log = logging.getLogger(__name__)


def channels(rules: quorum.ApprovalRules) -> dict[str, plugins.Notifier]:
    """Every channel's notifier. Raises ConfigurationError naming the channel."""
    built: dict[str, plugins.Notifier] = {}
    for name, channel in rules.channels.items():
        try:
            built[name] = plugins.make(channel.plugin, channel.options)
        except errors.ConfigurationError as exc:
            raise errors.ConfigurationError(f"approval channel {name}: {exc.message}") from exc
    return built


async def run(cfg: NotifierSettings | None = None, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop``): the batch in hand is settled, then it leaves."""
    cfg = cfg or NotifierSettings.model_validate({})
    sources = shared.PolicySources()
    # A bad routing file stops the service here, naming every problem (as check-config).
    rules = policy_check.load_approvals(sources.approvals, allowlist.Allowlist.load(),
                                        channels=True)
    built = channels(rules)
    try:
        async with services.started(database_url=cfg.database_url, role=cfg.db_role,
                                    pool_size=4, stop=stop) as up:
            notifier = worker.Notifier(
                pool=up.pool, channels=built,
                plugin_of={n: c.plugin for n, c in rules.channels.items()},
                console_url=cfg.console_url, worker_id=cfg.worker_id,
                lease=timedelta(seconds=cfg.lease_s), max_attempts=cfg.max_attempts,
                batch=cfg.batch, router=outbox.Router.of(rules))
            log.info("event=notifier_started channels=%s period_s=%s", sorted(built),
                     cfg.period_s)
            while not up.stop.is_set():
                claimed = 0
                try:
                    await notifier.sweep()
                    claimed = await notifier.run_once()
                except errors.StorageError:  # the next period tries again; never exit
                    log.exception("event=notifier_claim_failed")
                if claimed:
                    continue  # more may be due: no wait while there is a backlog
                try:
                    await asyncio.wait_for(up.stop.wait(), timeout=cfg.period_s)
                except TimeoutError:
                    pass
    finally:
        for notifier_ in built.values():
            await notifier_.aclose()
        log.info("event=notifier_stopped")
