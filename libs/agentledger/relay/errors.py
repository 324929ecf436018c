"""Errors of the relay.

They extend the closed hierarchy of :mod:`agentledger.errors`; they live here until that
module takes them (they are listed in the relay's hand-over notes), so the relay's rules
stay in one room.
"""

from __future__ import annotations

from agentledger.errors import AgentLedgerError


class RelayError(AgentLedgerError):
    """The relay cannot go on with this session."""

    code = "relay_error"
    retryable = True


class DecodeError(RelayError):
    """A logical replication message could not be decoded."""

    # Not retryable: the same WAL decodes the same way on every attempt.
    code = "relay_decode_error"
    retryable = False


class SlotMissing(RelayError):
    """The replication slot does not exist and the relay may not create it."""

    # An operator decides: a silently re-created slot would skip every change made while
    # it was missing.
    code = "relay_slot_missing"
    retryable = False


class PublicationMissing(RelayError):
    """The publication of the outbox tables is missing or incomplete (run the migrations)."""

    code = "relay_publication_missing"
    retryable = False


class DeliveryFailed(RelayError):
    """Kafka refused or timed out a record; the session restarts from the slot."""

    code = "relay_delivery_failed"


class ReplicationLost(RelayError):
    """The replication connection or the database went away."""

    code = "relay_replication_lost"


class BrokerUnavailable(RelayError):
    """Kafka could not create or describe a destination topic."""

    code = "relay_broker_unavailable"
