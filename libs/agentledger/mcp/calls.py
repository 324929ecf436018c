"""A tool call becomes a proposal through ingress, never a write; its answer is what is known.

``call`` checks the input as admission will, submits it with
:meth:`agentledger.client.GatewayClient.submit_proposal` under the call's idempotency key
(:mod:`agentledger.mcp.idempotency`) as a step of the call's run, if it names one
(:mod:`agentledger.mcp.runs`), then waits a bounded time (``wait_s`` for the whole
call): first for admission's answer to THIS submission — a refusal, a pending approval
(answered at once) or a recorded outcome — then for the outcome. Past the bound it answers
``in_progress`` with the operation id; ``status`` asks again later.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import httpx
import pydantic
from confluent_kafka import KafkaException
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from agentledger import client, errors
from agentledger.contracts import common
from agentledger.mcp import auth, idempotency, results, runs, tools
from agentledger.mcp import directory as directory_mod

log = logging.getLogger(__name__)

# A submission and when it was made: its answers are matched on its proposal id and read
# from that time on (the client's seek margin covers clock skew).
_Remembered = tuple[client.Submission, datetime]
# Even a wait whose budget is spent gets a short look: an answer already on the topics is
# found well within it, and answering `in_progress` for a known outcome helps nobody.
MIN_PHASE_S: Final = 0.5


def trace_of(meta: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The W3C trace context of a call's ``_meta`` (``traceparent``, ``tracestate``, as MCP
    carries it): the parent of the proposal's trace, hence of admission's spans. One that is
    not W3C is ignored (a trace is never a reason to refuse a call)."""
    found = meta or {}
    try:
        context = common.TraceContext.model_validate(
            {"traceparent": found.get("traceparent"), "tracestate": found.get("tracestate")})
    except pydantic.ValidationError:
        return None
    headers = {"traceparent": context.traceparent}
    if context.tracestate:
        headers["tracestate"] = context.tracestate
    return headers


class Calls:
    """Tool calls and status questions for verified callers."""

    def __init__(self, *, catalog: tools.Catalog, http: httpx.AsyncClient,
                 kafka_bootstrap: str, admissions_topic: str, outcomes_topic: str,
                 console_url: str, wait_s: float, remembered: int,
                 directory: directory_mod.Directory) -> None:
        """Args:
            catalog: The tools and the policy that filters them.
            http: An HTTP client with ingress' base URL, shared by every call.
            kafka_bootstrap: Where admission answers and outcomes are read.
            admissions_topic: ``agent.admissions.v1`` (or its namespaced name).
            outcomes_topic: ``agent.outcomes.v1`` (or its namespaced name).
            console_url: The approvals console, for links to pending approvals.
            wait_s: The longest a call waits for news before answering.
            remembered: How many submissions to remember for ``status``.
            directory: The principal directory and the ledger, for ``status``.
        """
        self.catalog, self.http = catalog, http
        self._bootstrap = kafka_bootstrap
        self._topics = (admissions_topic, outcomes_topic)
        self.console_url, self.wait_s, self._capacity = console_url, wait_s, remembered
        self.directory = directory
        self._submitted: collections.OrderedDict[tuple[uuid.UUID, str, uuid.UUID],
                                                 _Remembered] = collections.OrderedDict()

    def _gateway(self, caller: auth.Caller) -> client.GatewayClient:
        # Cheap: shares the HTTP client; a consumer is made per wait, in the client.
        return client.GatewayClient(token=caller.token, kafka_bootstrap=self._bootstrap,
                                    admissions_topic=self._topics[0],
                                    outcomes_topic=self._topics[1], http=self.http)

    async def call(self, caller: auth.Caller, name: str, tool_input: Mapping[str, Any],
                   meta: Mapping[str, Any] | None, *, session_run: str | None = None
                   ) -> results.Answer:
        """Propose one allowlisted action for ``caller`` and answer what is known.

        Args:
            session_run: The run of the caller's session (``runs.session_run``), used when
                ``_meta`` names none.

        Raises:
            MCPError: ``INVALID_PARAMS`` for a tool this caller cannot see or a malformed
                ``_meta`` key or run. Nothing is proposed.
        """
        deadline = time.monotonic() + self.wait_s
        spec = self.catalog.allowlist.actions.get(name)
        if spec is None or name not in self.catalog.effects(caller.session):
            raise MCPError(INVALID_PARAMS, f"no tool named {name[:64]!r} for this caller")
        # The run does not change which operation a call is: the key is derived without it.
        keyed = {k: v for k, v in tool_input.items() if k != tools.RUN}
        try:
            key = idempotency.key_for(meta, caller.session.principal_id, name, keyed)
            run = runs.run_for(meta, session_run)
        except errors.ValidationFailed as exc:
            raise MCPError(INVALID_PARAMS, exc.message) from exc
        try:
            proposal = tools.split(spec, tool_input)
        except errors.InvalidArguments as exc:
            return self._answered(name, results.from_error(exc, None, key))
        run = proposal.run or run  # the handle passed as an argument comes first
        gateway = self._gateway(caller)
        since = datetime.now(UTC)
        try:
            submitted = await gateway.submit_proposal(
                name, proposal.arguments, proposal.target,
                expected_revision=proposal.expected_revision, idempotency_key=key, run=run,
                trace=trace_of(meta))
        except errors.IdentityRejected as exc:
            # The caller passed this server's gate; ingress refusing its session is this
            # deployment's fault (keys or issuer out of step): a refusal, nothing proposed.
            log.warning("event=mcp_ingress_rejected_token reason=%s", exc.message[:200])
            return self._answered(name, results.Answer(
                "refused", None, key, code=exc.code,
                reason="ingress refused this server's session for the caller"))
        except errors.AgentLedgerError as exc:
            # The id ingress derives (or would have) for this key: the one to retry under.
            return self._answered(name, results.from_error(
                exc, client.operation_id_for(caller.token, key), key))
        slot = self._slot(caller, submitted.operation_id)
        previous = self._submitted.get(slot)
        self._remember(slot, (submitted, since))
        answer = await self._follow(gateway, submitted, since, key, deadline,
                                    through_approval=False)
        if answer.status == "conflict" and previous is not None:
            # A changed call under a used key: the operation is still the earlier call's.
            self._remember(slot, previous)
        return self._answered(name, answer)

    async def status(self, caller: auth.Caller, tool_input: Mapping[str, Any]
                     ) -> results.Answer:
        """What is known about one operation, waiting up to ``wait_s`` for an outcome (also
        past a pending approval: it may be decided).

        Answered only to the principal that proposed it, or an approver or operator of its
        tenant, as the directory records them now; a submission this process made is
        followed from its submission time, any other from the time the ledger recorded it.
        An id the ledger does not know in the caller's tenant is ``not_found`` at once: no
        topic is read from its start.
        """
        deadline = time.monotonic() + self.wait_s
        try:
            operation_id = tools.status_operation(tool_input)
        except errors.InvalidArguments as exc:
            return self._answered(tools.STATUS_TOOL, results.from_error(exc, None, None))
        gateway = self._gateway(caller)
        found = self._submitted.get(self._slot(caller, operation_id))
        if found is not None:
            submitted, since = found
            answer = await self._follow(gateway, submitted, since, submitted.idempotency_key,
                                        deadline, through_approval=True)
            return self._answered(tools.STATUS_TOOL, answer)
        try:
            # The caller's roles are the directory's, read at this request (auth.Gate).
            known = await self.directory.operation(caller.session.tenant_id, operation_id)
        except errors.StorageError as exc:
            return self._answered(tools.STATUS_TOOL, results.Answer(
                "unavailable", operation_id, code=exc.code, reason=exc.message))
        if known is None or not directory_mod.may_follow(caller.session, known):
            # Someone else's operation reads as one that does not exist: its existence is
            # not told either.
            return self._answered(tools.STATUS_TOOL, results.Answer("not_found", operation_id))
        settled = results.from_known(known, operation_id, self.console_url)
        if settled.status not in ("in_progress", "pending_approval"):
            return self._answered(tools.STATUS_TOOL, settled)
        answer = await self._follow(gateway, operation_id, known.since, None, deadline,
                                    through_approval=True, initial=settled)
        return self._answered(tools.STATUS_TOOL, answer)

    async def _follow(self, gateway: client.GatewayClient,
                      submitted: client.Submission | uuid.UUID, since: datetime | None,
                      key: str | None, deadline: float, *, through_approval: bool,
                      initial: results.Answer | None = None) -> results.Answer:
        operation_id = (submitted.operation_id if isinstance(submitted, client.Submission)
                        else submitted)
        waiting = initial or results.Answer("in_progress", operation_id, key)
        try:
            first = await gateway.await_outcome(
                submitted, since=since, until="admission",
                timeout_s=max(deadline - time.monotonic(), MIN_PHASE_S))
        except TimeoutError:
            return waiting
        except KafkaException as exc:
            log.warning("event=mcp_answers_unreadable error=%s", exc)
            return waiting
        answer = results.from_resolution(first, key, self.console_url)
        if answer.status == "pending_approval" and through_approval:
            waiting = answer
        elif answer.status != "in_progress":
            return answer
        left = deadline - time.monotonic()
        if left <= 0:
            return waiting
        try:
            done = await gateway.await_outcome(submitted, since=since, until="outcome",
                                               timeout_s=left)
        except TimeoutError:
            return waiting
        except KafkaException as exc:
            log.warning("event=mcp_answers_unreadable error=%s", exc)
            return waiting
        settled = results.from_resolution(done, key, self.console_url)
        return waiting if settled.status == "in_progress" else settled

    def _slot(self, caller: auth.Caller, operation_id: uuid.UUID
              ) -> tuple[uuid.UUID, str, uuid.UUID]:
        return caller.session.tenant_id, caller.session.principal_id, operation_id

    def _remember(self, slot: tuple[uuid.UUID, str, uuid.UUID], found: _Remembered) -> None:
        if self._capacity == 0:
            return
        self._submitted[slot] = found
        self._submitted.move_to_end(slot)
        while len(self._submitted) > self._capacity:
            self._submitted.popitem(last=False)

    def _answered(self, tool: str, answer: results.Answer) -> results.Answer:
        log.info("event=mcp_tool_answered tool=%s status=%s operation_id=%s code=%s", tool,
                 answer.status, answer.operation_id, answer.code)
        return answer
