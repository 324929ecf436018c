"""Shadow mode: a candidate planner beside the production one on live requests (R9.2).

``ShadowPlanner`` stands where the planner service's ``Proposer`` stands. For each request it
runs production exactly as before and returns its result (which the service publishes as
usual); then, in the background, it plans the same request with the candidate on the SAME
evidence (retrieval runs once) and records a ``ShadowComparisonV1`` on ``agent.shadow.v1``.

The candidate can never write:
- its proposal goes only into the comparison record, on a topic no admission consumes;
- it is marked ``shadow`` (admission refuses it: ``errors.ShadowRefused``) and carries no
  identity envelope (admission could not verify it even with the flag removed);
- and should a shadow command reach the ledger anyway, the executor denies it before any
  connector call (the ledger's ``shadow`` flag, loaded with the command).

The candidate never slows or breaks production: it runs after production returned, bounded
in number (a full house skips the comparison, counted) and in time, and its failures are
recorded as data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal
from uuid import UUID

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import canonical, errors
from agentledger.contracts import proposals, requests
from agentledger.evals import shadow_contract
from agentledger.planning import adapters, budget, proposer, retrieval
from agentledger.policy import allowlist as allowlist_mod

log = logging.getLogger(__name__)

# Shadow proposals get ids of their own: never the production proposal's id.
_SHADOW_NAMESPACE: Final = uuid.UUID("a3c1e0b4-9d7f-5e26-b8a4-52f0c6d91e3b")
# Comparisons in flight: a candidate slower than production falls behind at most this far;
# past it, comparisons are skipped (and counted) rather than queued without bound.
MAX_IN_FLIGHT: Final = 4
# A candidate that takes longer than this on one request is recorded as timed out.
TIMEOUT_S: Final = 120.0
# On shutdown, comparisons in flight get this long to finish before they are cancelled.
DRAIN_S: Final = 10.0

Recorder = Callable[[shadow_contract.ShadowComparisonV1], Awaitable[None]]
Result = proposals.ProposalV1 | adapters.Refusal


class ShadowSettings(BaseSettings):
    """Shadow mode of the planner service (env prefix ``AGENTLEDGER_PLANNER_SHADOW_``).

    Unset ``adapter`` (the default) means no shadow run.
    """

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_PLANNER_SHADOW_", extra="ignore")

    adapter: Literal["rules", "openai", "scripted"] | None = None
    openai_base_url: str = "http://127.0.0.1:11434/v1"
    openai_model: str = "gpt-4o-mini"
    openai_api_key: SecretStr | None = None
    script_path: Path | None = None
    topic: str = shadow_contract.SHADOW_TOPIC
    max_in_flight: int = MAX_IN_FLIGHT
    timeout_s: float = TIMEOUT_S


def build_candidate(cfg: ShadowSettings, rules: allowlist_mod.Allowlist) -> adapters.Adapter:
    """The candidate adapter the settings name.

    Raises:
        errors.ValidationFailed: No adapter is set, or ``scripted`` without a script.
    """
    if cfg.adapter == "openai":
        key = cfg.openai_api_key.get_secret_value() if cfg.openai_api_key else None
        return adapters.OpenAIAdapter(base_url=cfg.openai_base_url, model=cfg.openai_model,
                                      api_key=key, rules=rules)
    if cfg.adapter == "scripted":
        if cfg.script_path is None:
            raise errors.ValidationFailed("the scripted shadow adapter needs a script_path")
        return adapters.ScriptedAdapter.from_jsonl(cfg.script_path, rules)
    if cfg.adapter == "rules":
        return adapters.RulesAdapter()
    raise errors.ValidationFailed("no shadow adapter configured")


class _Remembering:
    """The production retriever, keeping what it returned for the candidate."""

    def __init__(self, inner: proposer.Retriever) -> None:
        self.inner = inner
        self.seen: retrieval.Snapshot | None = None

    async def snapshot(self, tenant_id: UUID, resource_id: str) -> retrieval.Snapshot:
        self.seen = await self.inner.snapshot(tenant_id, resource_id)
        return self.seen


@dataclass(frozen=True)
class _Fixed:
    """Serves the evidence production saw: the candidate plans on the very same snapshot."""

    seen: retrieval.Snapshot

    async def snapshot(self, tenant_id: UUID, resource_id: str) -> retrieval.Snapshot:
        return self.seen


def _summary(result: Result | None, info: proposals.PlannerInfo
             ) -> shadow_contract.PlanSummary:
    if isinstance(result, proposals.ProposalV1):
        usage = result.usage or proposals.TokenUsage()
        return shadow_contract.PlanSummary(
            planner=info, action=result.action, target=result.target,
            arguments_sha256=hashlib.sha256(canonical.canonical_bytes(result.arguments)
                                            ).hexdigest(),
            tokens=usage.prompt_tokens + usage.completion_tokens)
    if isinstance(result, adapters.Refusal):
        return shadow_contract.PlanSummary(
            planner=info, refusal=result.code[:64],
            tokens=result.usage.prompt_tokens + result.usage.completion_tokens)
    return shadow_contract.PlanSummary(planner=info)


def compare(request: requests.RequestV1, production: Result, candidate: Result | None,
            info: proposals.PlannerInfo, *, error: str | None = None
            ) -> shadow_contract.ShadowComparisonV1:
    """The comparison record; the candidate's proposal is marked shadow, its envelope dropped."""
    shadow = None
    if isinstance(candidate, proposals.ProposalV1):
        shadow = candidate.model_copy(update={
            "shadow": True, "identity": None,
            "proposal_id": uuid.uuid5(_SHADOW_NAMESPACE, str(request.request_id))})
    prod_info = (production.planner if isinstance(production, proposals.ProposalV1)
                 else proposals.PlannerInfo(name="production"))
    ours, theirs = _summary(production, prod_info), _summary(candidate, info)
    same_action = error is None and (ours.action, ours.target) == (theirs.action, theirs.target)
    return shadow_contract.ShadowComparisonV1(
        request_id=request.request_id, tenant_id=request.tenant_id,
        operation_id=request.operation_id, production=ours, candidate=theirs, proposal=shadow,
        same_action=same_action,
        same_arguments=same_action and ours.arguments_sha256 == theirs.arguments_sha256,
        error=error, recorded_at=datetime.now(UTC))


@dataclass
class ShadowPlanner:
    """Production's ``Proposer`` with a candidate beside it; same ``propose`` as production.

    Attributes:
        primary: The production planner; its result is returned unchanged.
        candidate: The adapter under evaluation.
        record: Where comparisons go (``kafka_recorder`` in the service).
        tokens: The candidate's own token budget, if any; never production's.
        skipped: Requests not compared because ``max_in_flight`` were already running.
    """

    primary: proposer.Proposer
    candidate: adapters.Adapter
    record: Recorder
    tokens: budget.TokenBudget | None = None
    max_in_flight: int = MAX_IN_FLIGHT
    timeout_s: float = TIMEOUT_S
    skipped: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    async def propose(self, request: requests.RequestV1, *, now: datetime | None = None
                      ) -> Result:
        """Production's result for ``request``; the candidate's comparison runs after it.

        Raises:
            Whatever production raises (the candidate then does not run).
        """
        seen = _Remembering(self.primary.retriever)
        result = await dataclasses.replace(self.primary, retriever=seen).propose(request, now=now)
        if seen.seen is not None:
            if len(self._tasks) >= self.max_in_flight:
                self.skipped += 1
                log.warning("event=shadow_skipped in_flight=%d", len(self._tasks))
            else:
                task = asyncio.create_task(self._shadow(request, result, seen.seen))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return result

    async def _shadow(self, request: requests.RequestV1, production: Result,
                      seen: retrieval.Snapshot) -> None:
        planner = proposer.Proposer(retriever=_Fixed(seen), adapter=self.candidate,
                                    rules=self.primary.rules,
                                    envelope_keys=self.primary.envelope_keys, tokens=self.tokens)
        info = proposals.PlannerInfo(name=self.candidate.name, model=self.candidate.model)
        candidate: Result | None = None
        error = None
        try:
            async with asyncio.timeout(self.timeout_s):
                candidate = await planner.propose(request)
        except TimeoutError:
            error = "the candidate timed out"
        except Exception as exc:  # a candidate's failure is a finding, never production's
            error = f"the candidate failed: {type(exc).__name__}"[:200]
        try:
            await self.record(compare(request, production, candidate, info, error=error))
        except Exception:
            log.exception("event=shadow_record_failed")

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Wait for comparisons in flight (cancelled after ``timeout_s``)."""
        pending = set(self._tasks)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def kafka_recorder(publish: Callable[..., Awaitable[object]], topic: str) -> Recorder:
    """A recorder publishing comparisons to ``topic`` (keyed by tenant) with ``publish``,
    e.g. a FastStream broker's ``publish``."""

    async def record(comparison: shadow_contract.ShadowComparisonV1) -> None:
        await publish(comparison.model_dump_json(by_alias=True).encode(), topic=topic,
                      key=str(comparison.tenant_id).encode())

    return record
