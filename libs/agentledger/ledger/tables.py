"""The ledger's tables, declared once (SQLAlchemy Core).

Migrations create the tables; this declaration is what the code and the schema test agree
on: a test applies every migration to an empty database and compares it with ``metadata``.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    ForeignKeyConstraint,
    LargeBinary,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()

COMMAND_STATES = ("pending", "dispatching", "succeeded", "denied", "expired", "unknown")

agent_command = Table(
    "agent_command",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("operation_id", UUID(as_uuid=True), primary_key=True),
    Column("request_hash", LargeBinary, nullable=False),
    Column("command", JSONB, nullable=False),
    Column("state", Text, nullable=False),
    Column("provider_receipt", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint(f"state IN {COMMAND_STATES!r}", name="agent_command_state_check"),
)

command_outbox = Table(
    "command_outbox",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("operation_id", UUID(as_uuid=True), primary_key=True),
    Column("available_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    ForeignKeyConstraint(
        ["tenant_id", "operation_id"],
        ["agent_command.tenant_id", "agent_command.operation_id"],
    ),
)
