"""The closed hierarchy of agentledger errors.

Every error has a stable ``code`` and says whether retrying the same operation can help
(``retryable``). Message handlers map errors to broker actions in one place:
retryable → redeliver, otherwise → dead-letter queue + ack.
"""

from __future__ import annotations

from typing import ClassVar


class AgentLedgerError(Exception):
    """An agentledger operation failed."""

    code: ClassVar[str] = "agentledger_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str | None = None, **details: object) -> None:
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        self.details = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly form for result topics and HTTP bodies."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable,
                **({"details": self.details} if self.details else {})}


class StorageError(AgentLedgerError):
    """The database could not complete the operation."""

    code = "storage_error"
    retryable = True


class MigrationError(AgentLedgerError):
    """The database schema could not be brought up to date."""

    code = "migration_error"


class ValidationFailed(AgentLedgerError):
    """The input does not satisfy its contract."""

    code = "validation_failed"


class PoisonMessage(ValidationFailed):
    """A message could not be parsed; it goes to the dead-letter topic and is acked."""

    code = "poison_message"
