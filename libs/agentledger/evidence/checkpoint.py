"""Signed checkpoints (signed tree heads): what the notary signs and how anyone checks it.

The signed message is a domain-separation line followed by the RFC 8785 form of the body::

    b"agentledger checkpoint v1\\n" + JCS({"v": 1, "tenant_id": …, "tree_size": n,
                                         "root_hash": "<hex>", "time": "…Z", "key_id": …})
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import canonical, errors
from agentledger.evidence import keys, leaf

CONTEXT: Final = b"agentledger checkpoint v1\n"
_FIELDS: Final = ("v", "tenant_id", "tree_size", "root_hash", "time", "key_id")


@dataclass(frozen=True)
class Checkpoint:
    """A verified (or just signed) checkpoint."""

    tenant_id: str
    tree_size: int
    root_hash: bytes
    time: str
    key_id: str
    body: str  # the exact canonical text that was signed
    signature: bytes

    def to_json(self) -> dict[str, Any]:
        """As a receipt carries it: the signed body verbatim, the signature in hex."""
        return {"body": self.body, "signature": self.signature.hex()}


def sign(signer: keys.Signer, *, tenant_id: str, tree_size: int, root_hash: bytes,
         at: datetime) -> Checkpoint:
    """Sign a tree head."""
    body = {"v": 1, "tenant_id": tenant_id, "tree_size": tree_size,
            "root_hash": root_hash.hex(), "time": leaf.timestamp(at), "key_id": signer.key_id}
    text = canonical.canonical_bytes(body)
    return Checkpoint(tenant_id, tree_size, root_hash, leaf.timestamp(at), signer.key_id,
                      text.decode(), signer.sign(CONTEXT + text))


def verify(body: str, signature: bytes, trusted: dict[str, ed25519.Ed25519PublicKey], *,
           field: str = "checkpoint") -> Checkpoint:
    """Check a checkpoint's signature against the trusted keys and parse it.

    Raises:
        errors.EvidenceInvalid: malformed, signed by a key not in ``trusted``, or the
            signature does not match the body.
    """
    try:
        parsed = json.loads(body)
        if not isinstance(parsed, dict) or tuple(sorted(parsed)) != tuple(sorted(_FIELDS)):
            raise ValueError("fields")
        if canonical.canonical_bytes(parsed).decode() != body or parsed["v"] != 1:
            raise ValueError("not canonical")
        root_hash = bytes.fromhex(parsed["root_hash"])
        size = parsed["tree_size"]
        if len(root_hash) != 32 or not isinstance(size, int) or size <= 0:
            raise ValueError("values")
    except (ValueError, TypeError, AttributeError, errors.ValidationFailed) as exc:
        raise errors.EvidenceInvalid(f"{field}.body is not a checkpoint body",
                                     field=f"{field}.body") from exc
    key = trusted.get(parsed["key_id"])
    if key is None:
        raise errors.EvidenceInvalid(
            f"{field} is signed by key {str(parsed['key_id'])[:64]!r}, which the trusted keys "
            "do not hold", field=f"{field}.body.key_id")
    try:
        key.verify(signature, CONTEXT + body.encode())
    except InvalidSignature as exc:
        raise errors.EvidenceInvalid(f"{field}.signature does not match its body",
                                     field=f"{field}.signature") from exc
    return Checkpoint(str(parsed["tenant_id"]), size, root_hash, str(parsed["time"]),
                      str(parsed["key_id"]), body, signature)
