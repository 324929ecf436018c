"""Errors → broker actions, in one place (STYLE rule 4).

- a retryable error (``AgentLedgerError.retryable``: the database or a provider is down)
  is re-raised, so the subscriber's NACK_ON_ERROR policy seeks back and the message is
  redelivered — nothing is lost, and the partition waits for the dependency to return;
- anything else (unparseable input, a bug) sends the raw message to the topic's ``*.dlq.v1``
  with the reason, and the message is acked: a poison message never stalls a partition.
"""

# No `from __future__ import annotations`: FastStream reads handler annotations at runtime.

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import confluent_kafka
import pydantic
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage

from agentledger import errors
from agentledger.contracts import dlq, topics
from agentledger.ledger import repository
from agentledger.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

Handler = Callable[[KafkaMessage], Awaitable[None]]


def classify(exc: BaseException) -> errors.AgentLedgerError:
    """The project error an exception stands for."""
    if isinstance(exc, errors.AgentLedgerError):
        return exc
    if isinstance(exc, pydantic.ValidationError | UnicodeDecodeError | ValueError):
        return errors.PoisonMessage(_summary(exc))
    # A ledger that cannot be reached (a pooled connection acquired while Postgres is down or
    # failing over) is an outage to wait out, not a poison message (issue 19).
    unreachable = repository.driver_error(exc)
    if unreachable is not None:
        return unreachable
    return errors.AgentLedgerError(f"unexpected {type(exc).__name__} while handling")


def _summary(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        # Locations and messages only: never echo the input values back.
        parts = [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                 for e in exc.errors(include_input=False, include_url=False)[:10]]
        return "; ".join(parts)[:1900]
    return str(exc)[:1900]


# The families of the topics consumers read, as the ``topic.family`` label of a dead letter:
# a topic's name without its version (``agent.proposals``), or ``exec`` for every connector's
# topic. A fixed set, so a suffixed or unknown topic name cannot widen the label.
_FAMILIES = frozenset(t.removesuffix(".v1") for t in (
    topics.GATEWAY_PROPOSALS, topics.REQUESTS, topics.PROPOSALS, topics.ADMISSIONS,
    topics.OUTCOMES, topics.AUDIT))


def topic_family(topic: str) -> str:
    """The bounded family of a source topic: ``agent.proposals.v1`` → ``agent.proposals``,
    ``exec.crm.v1`` → ``exec``; a topic of no known family → ``other``.

    A deployment's own topic names (``agent.proposals.t1a2b.v1``) keep their family.
    """
    parts = topic.split(".")
    if parts[0] == "exec" and len(parts) > 2:
        return "exec"
    return telemetry_metrics.bounded(".".join(parts[:2]), _FAMILIES)


def count_dead_letter(topic: str, code: str) -> None:
    """Count one dead letter of ``topic`` that reached its dead-letter topic."""
    telemetry_metrics.dead_letters.add(1, **{
        "topic.family": topic_family(topic), "outcome": telemetry_metrics.bounded(code)})


async def dead_letter(
    broker: KafkaBroker, msg: KafkaMessage, error: errors.AgentLedgerError, *,
    keep_value: bool = True,
) -> None:
    """Publish the message (or, without ``keep_value``, its coordinates and digest) and the
    reason to the source topic's dead-letter topic."""
    raw: Any = msg.raw_message
    record = dlq.DeadLetterV1.from_raw(
        topic=raw.topic(), partition=raw.partition(), offset=raw.offset(),
        key=raw.key(), value=raw.value(), error=error, failed_at=datetime.now(UTC),
        keep_value=keep_value,
    )
    await broker.publish(
        record.model_dump_json(by_alias=True).encode(), topic=topics.dlq_topic(raw.topic()),
        key=raw.key(), headers={"error_code": error.code},
    )
    count_dead_letter(raw.topic(), error.code)
    log.warning("event=dead_lettered topic=%s partition=%s offset=%s code=%s",
                raw.topic(), raw.partition(), raw.offset(), error.code)


def headers_of(msg: KafkaMessage) -> dict[str, bytes]:
    """The record's headers as a dict (the last value of a repeated name wins)."""
    raw = msg.raw_message
    if not isinstance(raw, confluent_kafka.Message):
        raise TypeError("batch messages have no single header set")
    return raw_headers(raw)


def raw_headers(msg: confluent_kafka.Message) -> dict[str, bytes]:
    """A raw record's headers as a dict (the last value of a repeated name wins)."""
    pairs: list[tuple[str, bytes | None]] = list(msg.headers() or [])  # type: ignore[arg-type]
    return {name: value for name, value in pairs if isinstance(value, bytes)}


def undecodable_headers(msg: confluent_kafka.Message) -> list[str]:
    """The names of the record's headers whose values are not UTF-8."""
    bad = []
    for name, value in raw_headers(msg).items():
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(name)
    return bad


# Set by ``tolerant_parser`` on a record one of whose header values is not UTF-8.
INVALID_HEADERS = "x-agentledger-invalid-headers"


async def tolerant_parser(msg: confluent_kafka.Message,
                          original: Callable[[confluent_kafka.Message], Awaitable[Any]]) -> Any:
    """A FastStream parser that survives header values that are not UTF-8.

    FastStream's confluent parser decodes every header value as UTF-8 before any handler or
    decoder runs: one invalid byte fails the parse outside ``guarded``, and the record was
    acked without a dead letter — silently lost (found by the hostile-Unicode test). Invalid
    values are replaced (U+FFFD) and the record is marked, so ``guarded`` dead-letters it.
    Every subscriber passes ``parser=tolerant_parser``.
    """
    pairs: list[tuple[str, bytes | None]] = list(msg.headers() or [])  # type: ignore[arg-type]
    bad = undecodable_headers(msg)
    if bad:
        fixed: list[tuple[str, str | bytes | None]] = [
            (n, v.decode("utf-8", "replace").encode() if v is not None else v) for n, v in pairs]
        fixed.append((INVALID_HEADERS, ",".join(bad)[:200].encode()))
        msg.set_headers(fixed)
    return await original(msg)


async def raw_body(msg: Any) -> bytes:
    """A FastStream decoder that decodes nothing: handlers parse the bytes themselves.

    FastStream's default decoder parses JSON before the handler runs, outside ``guarded``:
    a hostile body (say, nesting deep enough to exhaust the parser) then fails before any
    handler can dead-letter it, and with a redelivering ack policy stalls the partition for
    good (found by the fuzz suite). Every subscriber passes ``decoder=raw_body``.
    """
    body: bytes = msg.body
    return body


def guarded(broker: KafkaBroker, handle: Handler, *, payload_topic: bool = False) -> Handler:
    """Wrap a handler so every failure becomes exactly one broker action.

    ``payload_topic``: the topic carries payloads (proposals, requests): its dead letters keep
    coordinates and a digest, never the bytes.
    """

    async def run(msg: KafkaMessage) -> None:
        try:
            invalid = (headers_of(msg).get(INVALID_HEADERS)
                       if isinstance(msg.raw_message, confluent_kafka.Message) else None)
            if invalid is not None:
                raise errors.PoisonMessage(
                    f"header value is not UTF-8: {invalid.decode(errors='replace')}")
            await handle(msg)
        except Exception as exc:
            error = classify(exc)
            if error.retryable:
                log.warning("event=redeliver code=%s error=%s", error.code, error.message[:300])
                raise
            if not isinstance(exc, errors.AgentLedgerError | pydantic.ValidationError):
                log.exception("event=handler_bug")
            await dead_letter(broker, msg, error, keep_value=not payload_topic)

    return run
