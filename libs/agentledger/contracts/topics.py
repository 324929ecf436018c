"""Every Kafka topic name in one place; the version is in the name (STYLE rule 5)."""

from __future__ import annotations

import re
from typing import Final

GATEWAY_PROPOSALS: Final = "gateway.proposals.v1"
REQUESTS: Final = "agent.requests.v1"
PROPOSALS: Final = "agent.proposals.v1"
ADMISSIONS: Final = "agent.admissions.v1"
OUTCOMES: Final = "agent.outcomes.v1"
AUDIT: Final = "audit.events.v1"

_CONNECTOR = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_VERSIONED = re.compile(r"^(?P<base>[A-Za-z0-9._-]+?)\.(?P<version>v[0-9]+)$")


def exec_topic(connector: str) -> str:
    """The executor topic of a connector, e.g. ``exec.crm.v1``.

    Raises:
        ValueError: ``connector`` is not a valid connector name.
    """
    if not _CONNECTOR.fullmatch(connector):
        raise ValueError("invalid connector name")
    return f"exec.{connector}.v1"


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of a topic: ``agent.proposals.v1`` → ``agent.proposals.dlq.v1``.

    Raises:
        ValueError: ``topic`` has no ``.vN`` suffix or is already a dead-letter topic.
    """
    match = _VERSIONED.fullmatch(topic)
    if match is None or match["base"].endswith(".dlq"):
        raise ValueError(f"not a versioned source topic: {topic[:249]!r}")
    return f"{match['base']}.dlq.{match['version']}"


PROPOSALS_DLQ: Final = dlq_topic(PROPOSALS)
GATEWAY_PROPOSALS_DLQ: Final = dlq_topic(GATEWAY_PROPOSALS)
REQUESTS_DLQ: Final = dlq_topic(REQUESTS)
EXEC_CRM: Final = exec_topic("crm")
EXEC_BILLING: Final = exec_topic("billing")
