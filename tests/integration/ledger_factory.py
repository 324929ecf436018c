"""Build ledger rows for tests that exercise the repository directly."""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import UTC, datetime, timedelta

from agentledger.ledger import repository


def new_command(
    tenant_id: uuid.UUID | None = None,
    operation_id: uuid.UUID | None = None,
    *,
    body: str = "call back on Monday",
    connector: str = "crm",
    action: str = "crm.note.create",
) -> repository.NewCommand:
    tenant_id = tenant_id or uuid.uuid4()
    operation_id = operation_id or uuid.uuid4()
    return repository.NewCommand(
        tenant_id=tenant_id,
        operation_id=operation_id,
        request_hash=hashlib.sha256(f"{tenant_id}/{operation_id}/{body}".encode()).digest(),
        principal_id="user:alice",
        action=action,
        connector=connector,
        resource_id="cust-1",
        expected_revision=None,
        decision_id=uuid.uuid4(),
        policy_version="sha256:test",
        allowlist_version="sha256:test",
        expires_at=datetime.now(UTC) + timedelta(minutes=15),
        # Repository tests need opaque bytes here; encryption is tested with admission.
        payload_ciphertext=os.urandom(48),
        payload_key_version=1,
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
