"""The gateway client: what an agent gateway embeds to submit work and learn what happened.

Submit a request (a goal) or a proposal over HTTP to ingress, or a proposal over Kafka
(``gateway.proposals.v1``), each with the session token and an idempotency key; then
``await_outcome(submission)`` reads ``agent.admissions.v1`` and ``agent.outcomes.v1`` and
answers for THAT submission (matched on its proposal id): a changed resubmission under the
same key is told its own ``conflict``, never the original's answer or outcome.

Safe to retry: every submission carries an idempotency key (generated once per call when
the caller gives none, and returned), and ingress derives the operation id from it, so a
retried submission — by this client after a timeout, or by the caller with the returned
key — names the same operation (R3.1).

Runs: a proposal submitted with ``run="<name>"`` is a step of that run (the
``AgentLedger-Run`` header, ``agentledger-run`` over Kafka): every step of a run spends the
same budgets (R7), e.g. admission's tool calls per workflow. The run id ingress derives
(``identity.derive_run_id``: tenant, principal and name) is returned in
``Submission.run_id``. Without a run, each proposal is its own run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import httpx
import jwt
import pydantic
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from agentledger import errors, identity
from agentledger.contracts import admission, common, outcomes, topics
from agentledger.kafka import logs

# Transient answers worth repeating with the same key; anything else is the caller's to fix.
RETRY_STATUSES: Final = frozenset({429, 502, 503, 504})
# Ingress answers in milliseconds; ten seconds covers a slow Kafka acknowledgement.
HTTP_TIMEOUT_S: Final = 10.0
# Five attempts with exponential backoff from 0.2 s span ~6 s: a broker leader election.
ATTEMPTS: Final = 5
BACKOFF_S: Final = 0.2
log = logging.getLogger(__name__)
# Records can be stamped slightly before the submission returned (clock skew between hosts).
SEEK_MARGIN: Final = timedelta(seconds=30)


@dataclass(frozen=True)
class Submission:
    """What ingress accepted: keep ``idempotency_key`` to retry the same intent later."""

    operation_id: uuid.UUID
    idempotency_key: str
    tenant_id: uuid.UUID | None = None
    request_id: uuid.UUID | None = None
    proposal_id: uuid.UUID | None = None
    # The run the proposal is a step of (the budgets' workflow id), when one was named.
    run_id: uuid.UUID | None = None

    @property
    def answered_as(self) -> uuid.UUID | None:
        """The proposal id admission's answer to this submission carries: its own, or the
        one the planner derives from its request."""
        if self.proposal_id is not None:
            return self.proposal_id
        return identity.planned_proposal_id(self.request_id) if self.request_id else None


@dataclass(frozen=True)
class Resolution:
    """What is known about an operation: admission's answer and, once known, the outcome."""

    operation_id: uuid.UUID
    admission: admission.AdmissionResultV1 | None
    outcome: outcomes.Outcome | None

    @property
    def refused(self) -> bool:
        """Admission rejected the proposal or found a conflicting one; no outcome will come."""
        return self.admission is not None and self.admission.status in ("rejected", "conflict")


def operation_id_for(token: str, idempotency_key: str) -> uuid.UUID:
    """The operation id ingress will derive for this token and key.

    Reads the caller's OWN token without verifying it: only to predict the id, never to
    trust it. Ingress verifies the token and derives the same id from its verified claims.
    """
    claims = jwt.decode(token, options={"verify_signature": False})
    return identity.derive_operation_id(uuid.UUID(claims["tenant_id"]), claims["sub"],
                                        idempotency_key)


def run_id_for(token: str, run: str) -> uuid.UUID:
    """The run id ingress will derive for this token and run name (read like
    ``operation_id_for``: to predict, never to trust).

    Raises:
        errors.ValidationFailed: ``run`` is not a run name (``identity.is_run_name``).
    """
    claims = jwt.decode(token, options={"verify_signature": False})
    return identity.derive_run_id(uuid.UUID(claims["tenant_id"]), claims["sub"], run)


def _checked_run(run: str | None) -> str | None:
    # Refused here, before anything is sent: ingress would refuse it too (422 / DLQ).
    if run is not None and not identity.is_run_name(run):
        raise errors.ValidationFailed(
            "run must be 1-128 characters of A-Z a-z 0-9 . _ : ~ -, starting with a letter "
            "or digit")
    return run


class GatewayClient:
    """Submits requests and proposals for one session, and awaits their outcomes."""

    def __init__(
        self, *, token: str, ingress_url: str | None = None, kafka_bootstrap: str | None = None,
        gateway_topic: str = topics.GATEWAY_PROPOSALS, admissions_topic: str = topics.ADMISSIONS,
        outcomes_topic: str = topics.OUTCOMES, http: httpx.AsyncClient | None = None,
    ) -> None:
        """Args:
            token: The session token (without ``Bearer``).
            ingress_url: Ingress' base URL, for HTTP submissions.
            kafka_bootstrap: Kafka bootstrap servers, for Kafka submissions and outcomes.
            gateway_topic: Where Kafka proposals go.
            admissions_topic: Where admission answers.
            outcomes_topic: Where outcomes are published.
            http: An HTTP client to share; one is created otherwise.
        """
        self.token = token
        self._bootstrap = kafka_bootstrap
        self._gateway_topic = gateway_topic
        self._answer_topics = (admissions_topic, outcomes_topic)
        self._http = http or httpx.AsyncClient(base_url=ingress_url or "",
                                               timeout=HTTP_TIMEOUT_S)
        self._producer: Producer | None = None

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 10)

    async def submit_request(self, goal: str, resource: str, *,
                             idempotency_key: str | None = None) -> Submission:
        """POST a goal to ``/v1/requests``; retried with the same key on transient failures."""
        return await self._post("/v1/requests", {"goal": goal, "resource": resource},
                                idempotency_key)

    async def submit_proposal(self, action: str, arguments: Mapping[str, Any], target: str, *,
                              expected_revision: str | None = None,
                              idempotency_key: str | None = None,
                              run: str | None = None,
                              trace: Mapping[str, str] | None = None) -> Submission:
        """POST a proposal to ``/v1/proposals``; retried with the same key on transient failures.

        Args:
            run: The run this proposal is a step of (``AgentLedger-Run``): the steps of a run
                share its budgets. ``None``: the proposal is its own run.
            trace: W3C ``traceparent`` (and ``tracestate``) the proposal's trace is a child
                of, sent as those headers (ingress validates them).

        Raises:
            errors.ValidationFailed: ``run`` is not a run name (nothing is sent), or ingress
                refused the proposal (4xx).
            errors.IdentityRejected: Ingress refused the token.
            errors.IdempotencyConflict: The key already holds a command with other content.
            errors.StorageError: Ingress did not answer after retries.
        """
        return await self._post("/v1/proposals", _proposal_body(
            action, arguments, target, expected_revision), idempotency_key, _checked_run(run),
            trace)

    async def publish_proposal(self, action: str, arguments: Mapping[str, Any], target: str, *,
                               expected_revision: str | None = None,
                               idempotency_key: str | None = None,
                               timeout_s: float = 30.0, run: str | None = None) -> Submission:
        """Produce a proposal to ``gateway.proposals.v1`` (idempotent producer, acks=all).

        Args:
            run: As for ``submit_proposal`` (the ``agentledger-run`` header).

        Raises:
            errors.ValidationFailed: ``run`` is not a run name (nothing is sent).
            errors.StorageError: Kafka did not acknowledge within ``timeout_s``; publish
                again with the returned key's operation (same ``idempotency_key``).
        """
        if self._bootstrap is None:
            raise errors.ValidationFailed("publish_proposal needs kafka_bootstrap")
        run = _checked_run(run)
        key = idempotency_key or str(uuid.uuid4())
        operation_id = operation_id_for(self.token, key)
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self._bootstrap,
                                       "enable.idempotence": True, "acks": "all",
                                       "logger": logs.LIBRDKAFKA})
        producer = self._producer
        claims = jwt.decode(self.token, options={"verify_signature": False})
        where: list[tuple[int, int]] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                where.append((msg.partition(), msg.offset()))
        producer.produce(
            self._gateway_topic, key=str(claims.get("tenant_id", "")).encode(),
            value=json.dumps(_proposal_body(action, arguments, target,
                                            expected_revision)).encode(),
            headers=[("authorization", f"Bearer {self.token}".encode()),
                     ("idempotency-key", key.encode()),
                     *([("agentledger-run", run.encode())] if run is not None else [])],
            on_delivery=delivered,
        )
        if await asyncio.to_thread(producer.flush, timeout_s) != 0 or not where:
            raise errors.StorageError("Kafka did not acknowledge the proposal")
        # Ingress names the proposal after the record's coordinates: the answer carries it.
        _, proposal_id = identity.record_ids(self._gateway_topic, *where[0])
        return Submission(operation_id=operation_id, idempotency_key=key,
                          proposal_id=proposal_id,
                          run_id=run_id_for(self.token, run) if run is not None else None)

    async def await_outcome(
        self, submitted: Submission | uuid.UUID, *, timeout_s: float = 60.0,
        since: datetime | None = None, until: Literal["admission", "outcome"] = "outcome",
    ) -> Resolution:
        """Wait until the submission is refused, or has an outcome (or, with
        ``until="admission"``, until admission answered it).

        Args:
            submitted: The ``Submission``: answers are matched on its proposal id, so a
                resubmission with a changed payload gets its own answer (a conflict), not
                the first submission's. A bare operation id takes any answer for it.
            timeout_s: How long to wait.
            since: When it was submitted; reading starts there (default: topic start).
            until: ``"outcome"`` (default) or ``"admission"``.

        Raises:
            TimeoutError: Nothing conclusive within ``timeout_s``.
        """
        if self._bootstrap is None:
            raise errors.ValidationFailed("await_outcome needs kafka_bootstrap")
        if isinstance(submitted, Submission):
            operation_id, expected = submitted.operation_id, submitted.answered_as
        else:
            operation_id, expected = submitted, None
        return await asyncio.to_thread(self._await, operation_id, expected, timeout_s, since,
                                       until)

    # --- internals ---------------------------------------------------------------------------

    async def _post(self, path: str, body: Mapping[str, Any], key: str | None,
                    run: str | None = None, trace: Mapping[str, str] | None = None
                    ) -> Submission:
        key = key or str(uuid.uuid4())
        headers = {**{k: v for k, v in (trace or {}).items() if k in ("traceparent",
                                                                      "tracestate")},
                   "Authorization": f"Bearer {self.token}", "Idempotency-Key": key}
        if run is not None:
            headers["AgentLedger-Run"] = run
        last: str = "no attempt"
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))  # backoff, not a wait
            try:
                response = await self._http.post(path, json=body, headers=headers)
            except httpx.TransportError as exc:
                last = type(exc).__name__
                continue
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}"
                continue
            return _accepted(response, key)
        raise errors.StorageError(f"ingress unavailable after {ATTEMPTS} attempts ({last}); "
                                  f"retry with idempotency key {key}", idempotency_key=key)

    def _await(self, operation_id: uuid.UUID, expected: uuid.UUID | None, timeout_s: float,
               since: datetime | None, until: str) -> Resolution:
        consumer = Consumer({"bootstrap.servers": self._bootstrap,
                             "group.id": f"gateway-client-{uuid.uuid4()}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "logger": logs.LIBRDKAFKA})
        try:
            deadline = time.monotonic() + timeout_s
            metadata = consumer.list_topics(timeout=10)
            assigned: list[TopicPartition] = []
            # Topics whose start could not be looked up yet (a partition without a leader: a
            # topic created a moment ago by its first record, or an election): looked up
            # again below until the deadline, never a reason to give up the wait.
            unplaced: set[str] = set()
            for topic in self._answer_topics:
                if topic in metadata.topics:
                    try:
                        assigned += self._start_positions(
                            consumer, topic, metadata.topics[topic].partitions, since)
                    except KafkaException as exc:
                        log.info("event=answers_start_retry topic=%s error=%s", topic, exc)
                        unplaced.add(topic)
            consumer.assign(assigned)
            missing = set(self._answer_topics) - {tp.topic for tp in assigned} - unplaced
            found_admission: admission.AdmissionResultV1 | None = None
            found_outcome: outcomes.Outcome | None = None
            while time.monotonic() < deadline:
                if missing or unplaced:
                    self._place(consumer, missing, unplaced, since)
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None:
                    continue
                value = msg.value() or b""
                try:
                    if msg.topic() == self._answer_topics[0]:
                        answer = admission.AdmissionResultV1.model_validate_json(value)
                        if answer.operation_id != operation_id or (
                                expected is not None and answer.proposal_id != expected):
                            continue  # another submission's answer for the same operation
                        found_admission = answer
                        settled = Resolution(operation_id, answer, answer.outcome or found_outcome)
                        if settled.refused:
                            # Refused: no outcome of its own (one read meanwhile belongs to
                            # the operation's other, admitted submission).
                            return Resolution(operation_id, answer, None)
                        if (until == "admission" or settled.refused or answer.outcome
                                or found_outcome is not None):
                            return settled
                    else:
                        event = outcomes.OutcomeEventV1.model_validate_json(value)
                        if event.operation_id != operation_id:
                            continue
                        # Topics interleave: an outcome may be read before the answer. With a
                        # submission to match, the outcome is ours only once our own answer
                        # says it was admitted (a changed resubmission is a conflict).
                        found_outcome = event.outcome
                        if until == "admission" or (expected is not None
                                                    and found_admission is None):
                            continue
                        return Resolution(operation_id, found_admission, event.outcome)
                except pydantic.ValidationError:
                    continue  # not ours to judge; the producer's DLQ handles poison
            raise TimeoutError(f"no conclusive answer for operation {operation_id}")
        finally:
            consumer.close()

    def _place(self, consumer: Consumer, missing: set[str], unplaced: set[str],
               since: datetime | None) -> None:
        """Assign the answer topics not read yet, where the broker can now say where to start:
        one created after the wait began from its start (every record in it is new), one
        whose lookup failed from ``since``. Each placed topic leaves its set; a failure
        leaves it there for the next turn."""
        try:
            metadata = consumer.list_topics(timeout=5)
        except KafkaException:
            return  # the broker is away: the next turn asks again (the wait's deadline holds)
        for topic in [t for t in (*missing, *unplaced) if t in metadata.topics]:
            partitions = metadata.topics[topic].partitions
            try:
                new = ([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
                       if topic in missing else
                       self._start_positions(consumer, topic, partitions, since))
            except KafkaException:
                continue
            consumer.incremental_assign(new)
            missing.discard(topic)
            unplaced.discard(topic)

    @staticmethod
    def _start_positions(consumer: Consumer, topic: str, partitions: Mapping[int, Any],
                         since: datetime | None) -> list[TopicPartition]:
        wanted = [TopicPartition(topic, p, OFFSET_BEGINNING if since is None
                                 else int((since - SEEK_MARGIN).timestamp() * 1000))
                  for p in partitions]
        if since is None:
            return wanted
        # The end offsets FIRST: a record stamped after `since` and produced after this call
        # gets an offset at or past them; one produced before it is found by the time lookup.
        # (Starting "at the end" instead resolves the end later, at the first fetch, and
        # skips an answer produced in between: seen as a timeout.)
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), timeout=10, cached=False)[1] for tp in wanted}
        positions = consumer.offsets_for_times(wanted, timeout=10)
        return [TopicPartition(tp.topic, tp.partition,
                               tp.offset if tp.offset >= 0 else ends[(tp.topic, tp.partition)])
                for tp in positions]


def _proposal_body(action: str, arguments: Mapping[str, Any], target: str,
                   expected_revision: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"action": action, "arguments": dict(arguments), "target": target}
    if expected_revision is not None:
        body["expected_revision"] = expected_revision
    return body


def _accepted(response: httpx.Response, key: str) -> Submission:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 202:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = common.reason_text(str(error.get("message", f"HTTP {response.status_code}")))
        if response.status_code == 401:
            raise errors.IdentityRejected(message)
        if response.status_code == 409:
            # The key already holds a command with other content: nothing was published.
            raise errors.IdempotencyConflict(message, idempotency_key=key)
        raise errors.ValidationFailed(f"ingress refused ({response.status_code}): {message}",
                                      code=error.get("code"))
    return Submission(
        operation_id=uuid.UUID(body["operation_id"]), idempotency_key=key,
        tenant_id=uuid.UUID(body["tenant_id"]),
        request_id=uuid.UUID(body["request_id"]) if body.get("request_id") else None,
        proposal_id=uuid.UUID(body["proposal_id"]) if body.get("proposal_id") else None,
        run_id=uuid.UUID(body["run_id"]) if body.get("run_id") else None,
    )
