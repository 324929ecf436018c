"""The ledger's tables, declared once (SQLAlchemy Core).

Migrations create the tables; this declaration is what the code and the schema test agree
on: a test applies every migration to an empty database and compares it with ``metadata``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()


def _ts(name: str, *, nullable: bool = True, default_now: bool = False) -> Column[object]:
    return Column(
        name, DateTime(timezone=True), nullable=nullable,
        server_default=text("now()") if default_now else None,
    )


agent_command = Table(
    "agent_command",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("operation_id", UUID(as_uuid=True), primary_key=True),
    Column("request_hash", LargeBinary, nullable=False),
    Column("state", Text, nullable=False),
    Column("provider_receipt", Text),
    _ts("lease_until"),
    _ts("retry_at"),  # a requeue's backoff: when it may be dispatched again (0019)
    _ts("created_at", nullable=False, default_now=True),
    Column("principal_id", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("connector", Text, nullable=False),
    Column("resource_id", Text, nullable=False),
    Column("expected_revision", Text),
    Column("decision_id", UUID(as_uuid=True), nullable=False),
    Column("policy_version", Text, nullable=False),
    Column("allowlist_version", Text, nullable=False),
    _ts("expires_at", nullable=False),
    Column("payload_ciphertext", LargeBinary),
    Column("payload_key_version", Integer),
    _ts("payload_purged_at"),
    Column("claim_token", UUID(as_uuid=True)),
    Column("claimed_by", Text),
    Column("fencing_generation", BigInteger, nullable=False, server_default=text("0")),
    Column("outcome_reason", Text),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("dispatched_at"),
    _ts("finished_at"),
    # A provider's later answer disagrees with the recorded outcome (0024): a flag, not a state.
    _ts("contradicted_at"),
    Column("contradiction", Text),
)

command_attempt = Table(
    "command_attempt",
    metadata,
    Column("attempt_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    Column("fencing_generation", BigInteger, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    _ts("started_at", nullable=False, default_now=True),
    _ts("finished_at"),
    Column("result", Text),
    Column("detail", Text),
    Column("traceparent", Text),
    # When the pre-call check stamped it (0014): it may have reached the connector.
    _ts("sent_at"),
    # What the provider answered after the claim was taken from this attempt's worker (0024).
    Column("late_answer", Text),
    Column("late_receipt", Text),
    _ts("late_at"),
    # The call bound (margin included, s) the pre-call check covered (0052): the reconciler's
    # "may still act" window after the lease.
    Column("call_bound_s", Double),
    ForeignKeyConstraint(
        ["tenant_id", "operation_id"],
        ["agent_command.tenant_id", "agent_command.operation_id"],
    ),
)

tenant_data_key = Table(
    "tenant_data_key",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("key_version", Integer, primary_key=True),
    Column("wrapped_key", LargeBinary, nullable=False),
    Column("master_key_id", Text, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
)


command_resolution = Table(
    "command_resolution",
    metadata,
    Column("resolution_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    Column("resolved_by", Text, nullable=False),
    _ts("resolved_at", nullable=False, default_now=True),
    Column("outcome", Text, nullable=False),
    Column("receipt", Text),
    Column("reason", Text, nullable=False),
    Column("evidence", Text),
    # A late call may still land and contradict it (0024).
    Column("provisional", Boolean, nullable=False, server_default=text("false")),
    ForeignKeyConstraint(
        ["tenant_id", "operation_id"],
        ["agent_command.tenant_id", "agent_command.operation_id"],
    ),
)

def _outbox_columns() -> list[Column[object]]:
    """Debezium Outbox Event Router columns plus the W3C context captured at admission."""
    return [
        Column("aggregatetype", Text, nullable=False),
        Column("aggregateid", Text, nullable=False),
        Column("type", Text, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("traceparent", Text),
        Column("tracestate", Text),
        _ts("created_at", nullable=False, default_now=True),
    ]


command_outbox = Table(
    "command_outbox",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("operation_id", UUID(as_uuid=True), primary_key=True),
    _ts("available_at", nullable=False, default_now=True),
    Column("id", UUID(as_uuid=True), nullable=False, unique=True),
    *_outbox_columns(),
    ForeignKeyConstraint(
        ["tenant_id", "operation_id"],
        ["agent_command.tenant_id", "agent_command.operation_id"],
    ),
)

event_outbox = Table(
    "event_outbox",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True)),
    *_outbox_columns(),
)

# --- policy directory and decisions, budgets (migration 0003) ------------------------------

principal = Table(
    "principal",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("principal_id", Text, primary_key=True),
    Column("roles", JSONB, nullable=False, server_default=text("'[]'")),
    _ts("revoked_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
)

policy_decision = Table(
    "policy_decision",
    metadata,
    Column("decision_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("principal_id", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("resource_id", Text, nullable=False),
    Column("effect", Text, nullable=False),
    Column("policy_version", Text, nullable=False),
    Column("reasons", JSONB, nullable=False, server_default=text("'[]'")),
    Column("reason", Text, nullable=False),
    Column("stage", Text, nullable=False, server_default=text("'admission'")),
    Column("operation_id", UUID(as_uuid=True)),
    _ts("decided_at", nullable=False, default_now=True),
)

budget = Table(
    "budget",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("workflow_id", Text, primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("limit_amount", BigInteger, nullable=False),
    Column("reserved", BigInteger, nullable=False, server_default=text("0")),
    Column("used", BigInteger, nullable=False, server_default=text("0")),
    _ts("deadline"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
)

budget_reservation = Table(
    "budget_reservation",
    metadata,
    Column("reservation_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("workflow_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("used_amount", BigInteger),
    Column("state", Text, nullable=False, server_default=text("'reserved'")),
    Column("operation_id", UUID(as_uuid=True)),
    _ts("created_at", nullable=False, default_now=True),
    _ts("settled_at"),
    ForeignKeyConstraint(
        ["tenant_id", "workflow_id", "kind"],
        ["budget.tenant_id", "budget.workflow_id", "budget.kind"],
    ),
)


# --- approvals (migration 0005) -----------------------------------------------------------

approval_request = Table(
    "approval_request",
    metadata,
    Column("approval_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    Column("proposal_id", UUID(as_uuid=True), nullable=False),
    Column("principal_id", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("connector", Text, nullable=False),
    Column("resource_id", Text, nullable=False),
    Column("expected_revision", Text),
    Column("request_hash", LargeBinary, nullable=False),
    Column("payload_ciphertext", LargeBinary),  # NULL once retention purged it (0016)
    Column("payload_key_version", Integer),
    Column("policy_version", Text, nullable=False),
    Column("allowlist_version", Text, nullable=False),
    Column("decision_id", UUID(as_uuid=True), nullable=False),
    Column("risk", Text, nullable=False),
    Column("evidence", JSONB, nullable=False, server_default=text("'[]'")),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    _ts("expires_at", nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    Column("decided_by", Text),
    _ts("decided_at"),
    Column("decision_reason", Text),
    Column("approval_decision_id", UUID(as_uuid=True)),
    Column("shown_hash", LargeBinary),
    Column("superseded_by", UUID(as_uuid=True), ForeignKey("approval_request.approval_id")),
    Column("traceparent", Text),
    Column("tracestate", Text),
    # 0016: evidence excerpts encrypted with the tenant's key; retention's purge time.
    Column("evidence_ciphertext", LargeBinary),
    Column("evidence_key_version", Integer),
    _ts("payload_purged_at"),
)


# --- audit ledger (migration 0006) --------------------------------------------------------

audit_event = Table(
    "audit_event",
    metadata,
    Column("event_id", UUID(as_uuid=True), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True)),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("traceparent", Text),
    _ts("recorded_at", nullable=False, default_now=True),
    Column("leaf_hash", LargeBinary, nullable=False),  # RFC 6962 leaf hash (migration 0050)
)


# --- the tamper-evident log (migration 0050, issue 43) ------------------------------------

audit_log = Table(
    "audit_log",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("idx", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("leaf_hash", LargeBinary, nullable=False),
)

audit_checkpoint = Table(
    "audit_checkpoint",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("tree_size", BigInteger, primary_key=True),
    Column("root_hash", LargeBinary, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("key_id", Text, nullable=False),
    _ts("signed_at", nullable=False),
    Column("body", Text, nullable=False),
    Column("signature", LargeBinary, nullable=False),
    Column("frontier", ARRAY(LargeBinary), nullable=False),
)

audit_notary_cursor = Table(
    "audit_notary_cursor",
    metadata,
    Column("singleton", Boolean, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)


# --- planner token budgets (migration 0008) -----------------------------------------------

budget_default = Table(
    "budget_default",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("limit_amount", BigInteger, nullable=False),
    _ts("updated_at", nullable=False, default_now=True),
)


# --- shadow marker (migration 0009) -------------------------------------------------------

# A command of a shadow run (R9.2) is never dispatched: the executor refuses one marked here.
# Appended to agent_command where the migration adds it, so each block matches one migration.
agent_command.append_column(
    Column("shadow", Boolean, nullable=False, server_default=text("false")))


# --- the operator's budgets over principals, tenants and time (migration 0040) ------------

budget_window = Table(
    "budget_window",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("budget", Text, primary_key=True),
    Column("scope_key", Text, primary_key=True),
    Column("window_start", DateTime(timezone=True), primary_key=True),
    Column("limit_amount", BigInteger, nullable=False),
    Column("reserved", BigInteger, nullable=False, server_default=text("0")),
    Column("used", BigInteger, nullable=False, server_default=text("0")),
    _ts("updated_at", nullable=False, default_now=True),
)

budget_charge = Table(
    "budget_charge",
    metadata,
    Column("charge_id", UUID(as_uuid=True), primary_key=True,
           server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    Column("budget", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("scope_key", Text, nullable=False),
    Column("window_kind", Text, nullable=False),
    _ts("window_start"),
    Column("unit", Text, nullable=False),
    Column("currency", Text),
    Column("amount", BigInteger, nullable=False),
    Column("limit_amount", BigInteger, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'reserved'")),
    _ts("created_at", nullable=False, default_now=True),
    _ts("settled_at"),
)


# --- N-of-M approvals (migration 0041) ----------------------------------------------------

approval_request.append_column(
    Column("required_approvals", Integer, nullable=False, server_default=text("1")))
approval_request.append_column(Column("approver_role", Text))
approval_request.append_column(Column("quorum_rule", Text))
# Escalation (issue 42, migration 0043): when, and to which group, a request was escalated.
approval_request.append_column(_ts("escalated_at"))
approval_request.append_column(Column("escalated_to", Text))

approval_vote = Table(
    "approval_vote",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("approval_id", UUID(as_uuid=True), ForeignKey("approval_request.approval_id"),
           primary_key=True),
    Column("approver", Text, primary_key=True),
    Column("request_hash", LargeBinary, nullable=False),
    Column("decision_id", UUID(as_uuid=True), nullable=False),
    _ts("voted_at", nullable=False, default_now=True),
)


# --- narrow-only edits (migration 0046) ---------------------------------------------------

approval_request.append_column(
    Column("narrowed_from", UUID(as_uuid=True), ForeignKey("approval_request.approval_id")))

# Notifications of pending approvals (issue 42, migration 0042): their own outbox.
approval_notification = Table(
    "approval_notification",
    metadata,
    Column("idempotency_key", Text, primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("approval_id", UUID(as_uuid=True), ForeignKey("approval_request.approval_id"),
           nullable=False),
    Column("kind", Text, nullable=False),
    Column("group_name", Text, nullable=False),
    Column("recipient", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("address", Text, nullable=False),
    Column("message", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    _ts("next_attempt_at", nullable=False, default_now=True),
    Column("lease_owner", Text),
    Column("last_error", Text),
    _ts("created_at", nullable=False, default_now=True),
    _ts("sent_at"),
)
