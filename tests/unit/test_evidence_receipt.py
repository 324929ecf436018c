"""Receipts, checkpoints and keys without a database: a receipt built from synthetic events
verifies with the JWKS, a rotated key keeps verifying what it signed, a retired key can no
longer sign, and a receipt edited anywhere is refused."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentledger import errors
from agentledger.evidence import checkpoint, keys, leaf, merkle, receipt

TENANT, OP = str(uuid.uuid4()), str(uuid.uuid4())


def events() -> list[dict[str, Any]]:
    at = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    return [leaf.event_object(event_id=uuid.uuid4(), tenant_id=TENANT, operation_id=OP,
                              type=t, payload=p, traceparent=None, recorded_at=at)
            for t, p in [("command.admitted", {"recorded_hash": "ab" * 32, "action": "a",
                                                "policy_version": "p1", "big": 2**60}),
                         ("command.claimed", {"worker_id": "w1", "kind": "dispatch"}),
                         ("command.succeeded", {"receipt": "r-1"})]]


def build(signer: keys.Signer, evs: list[dict[str, Any]]) -> bytes:
    other = [leaf.leaf_hash(leaf.event_object(
        event_id=uuid.uuid4(), tenant_id=TENANT, operation_id=None, type="x", payload={},
        traceparent=None, recorded_at=datetime.now(UTC))) for _ in range(4)]
    mine = [leaf.leaf_hash(e) for e in evs]
    tree = other[:2] + mine[:1] + other[2:] + mine[1:]
    positions = [2, 5, 6]
    cp = checkpoint.sign(signer, tenant_id=TENANT, tree_size=len(tree),
                         root_hash=merkle.root(tree), at=datetime.now(UTC))
    doc = {"format": receipt.FORMAT, "version": receipt.VERSION, "tenant_id": TENANT,
           "operation_id": OP,
           "command": {"request_hash": "ab" * 32, "bound": None, "withheld": "encrypted"},
           "summary": receipt.summarize(evs),
           "leaves": [{"index": i, "leaf_hash": tree[i].hex(), "event": e,
                       "inclusion_proof": [h.hex() for h in merkle.inclusion_proof(tree, i)]}
                      for i, e in zip(positions, evs, strict=True)],
           "checkpoint": cp.to_json()}
    return leaf.canonical_json(doc) + b"\n"


def trusted(directory: Path) -> dict[str, Any]:
    return {keys.key_id(k): k for k in keys.public_keys(directory)}


def test_a_receipt_verifies_and_any_edit_is_refused(tmp_path: Path) -> None:
    keys.generate(tmp_path)
    data = build(keys.load_signer(tmp_path), events())
    assert receipt.verify(data, trusted(tmp_path)).events == 3
    for i in range(len(data)):
        with pytest.raises(errors.EvidenceInvalid):
            receipt.verify(data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1:], trusted(tmp_path))
    doc = json.loads(data)
    doc["summary"]["attempts"][0]["worker_id"] = "w2"
    with pytest.raises(errors.EvidenceInvalid) as refused:
        receipt.verify(leaf.canonical_json(doc) + b"\n", trusted(tmp_path))
    assert refused.value.field == "summary.attempts[0].worker_id"
    pretty = json.dumps(json.loads(data), indent=1).encode()
    with pytest.raises(errors.EvidenceInvalid) as refused:
        receipt.verify(pretty, trusted(tmp_path))
    assert refused.value.field == "(file)"


def test_rotation_keeps_old_receipts_verifying_and_retiring_stops_signing(
        tmp_path: Path) -> None:
    first = keys.generate(tmp_path)
    old = build(keys.load_signer(tmp_path), events())
    second = keys.generate(tmp_path)
    assert keys.active_id(tmp_path) == second != first
    new = build(keys.load_signer(tmp_path), events())
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(keys.jwks(tmp_path)))
    published = keys.load_jwks(jwks_file)
    assert set(published) == {first, second}
    assert receipt.verify(old, published).checkpoint.key_id == first
    assert receipt.verify(new, published).checkpoint.key_id == second
    keys.retire(tmp_path, first)
    assert not (tmp_path / f"{first}.pem").exists()
    assert set(keys.load_jwks(jwks_file)) == {k["kid"] for k in keys.jwks(tmp_path)["keys"]}
    with pytest.raises(errors.ConfigurationError):
        keys.retire(tmp_path, second)  # the active key: rotate first
    with pytest.raises(errors.EvidenceInvalid) as refused:
        receipt.verify(old, {second: published[second]})
    assert refused.value.field == "checkpoint.body.key_id"


def test_a_jwks_whose_kid_is_not_the_keys_thumbprint_is_refused(tmp_path: Path) -> None:
    keys.generate(tmp_path)
    doc = keys.jwks(tmp_path)
    doc["keys"][0]["kid"] = "someone-else"
    (tmp_path / "jwks.json").write_text(json.dumps(doc))
    with pytest.raises(errors.ConfigurationError):
        keys.load_jwks(tmp_path / "jwks.json")
