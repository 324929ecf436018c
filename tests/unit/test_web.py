"""The HTTP pieces every shell shares: one error → status table, one bearer parser."""

from __future__ import annotations

import pytest

from agentledger import errors, identity, web


@pytest.mark.parametrize(("exc", "status"), [
    (errors.IdentityRejected("forged"), 401),
    (errors.IdempotencyConflict("other content"), 409),
    (errors.ApprovalNotFound(approval_id="a"), 404),
    (errors.ApprovalExpired("late"), 410),
    # Subclasses of ValidationFailed keep their own status, not their parent's 400.
    (errors.StaleRevision("changed"), 409),
    (errors.ApprovalMismatch("other hash"), 422),
    (errors.UnknownAction("gone"), 409),
    (errors.PolicyDenied("no"), 403),
    (errors.ValidationFailed("bad"), 400),
    (errors.StorageError("down"), 503),
])
def test_each_error_has_one_status(exc: errors.AgentLedgerError, status: int) -> None:
    assert web.status_of(exc) == status


def test_a_later_entry_never_shadows_an_earlier_subclass() -> None:
    kinds = [kind for kind, _ in web.STATUS]
    for i, kind in enumerate(kinds):
        for later in kinds[i + 1:]:
            assert not issubclass(later, kind), (later, kind)


@pytest.mark.parametrize("header", ["Bearer abc", "bearer  abc ", b"Bearer abc"])
def test_bearer_reads_the_token(header: str | bytes) -> None:
    assert web.bearer(header) == "abc"


@pytest.mark.parametrize("header", [None, "", "Token abc", "Bearer", "Bearer   ", b"Basic x"])
def test_bearer_refuses_anything_else(header: str | bytes | None) -> None:
    with pytest.raises(errors.IdentityRejected):
        web.bearer(header)


@pytest.mark.parametrize(("key", "ok"), [
    ("retry-1", True), ("a" * 255, True), ("a.b_c:d~e-f", True),
    ("", False), ("a" * 256, False), ("has space", False), ("key\n", False), ("é", False),
])
def test_one_idempotency_key_alphabet(key: str, ok: bool) -> None:
    assert identity.is_idempotency_key(key) is ok
