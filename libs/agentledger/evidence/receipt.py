"""A receipt per operation: one JSON file that an auditor verifies offline (issue 43).

Export reads the operation's audit events, its tenant's newest signed checkpoint and the
tenant's log, and writes the events with their inclusion proofs under that checkpoint.
Verification needs only the file and a JWKS: no database, no network.

The file is the RFC 8785 form of this object, plus a newline (so any change of any byte
either changes a value or breaks the canonical form)::

    {"format": "agentledger.receipt", "version": 1,
     "tenant_id": …, "operation_id": …,
     "command": {"request_hash": hex | null, "bound": {…} | null,
                 "withheld": "encrypted" | "purged" | null},
     "summary": {…},             # recomputed from the events by the verifier
     "leaves": [{"index": n, "leaf_hash": hex, "inclusion_proof": [hex, …],
                 "event": {…}}],  # the audit events, in log order
     "checkpoint": {"body": "<the signed canonical text>", "signature": hex}}

docs/evidence.md describes each field, what verifies it, and what a receipt does not prove.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import canonical, errors, sql
from agentledger.evidence import checkpoint, leaf, merkle
from agentledger.ledger import keys as ledger_keys
from agentledger.ledger import repository as ledger

Q = sql.load(Path(__file__).with_name("queries.sql"))

FORMAT: Final = "agentledger.receipt"
VERSION: Final = 1
_TOP: Final = ("format", "version", "tenant_id", "operation_id", "command", "summary",
               "leaves", "checkpoint")
# Why a receipt has no bound fields: the exporter could not decrypt them, or retention
# purged them (the hash stays either way).
WITHHELD: Final = ("encrypted", "purged")
# What the summary keeps of an event's payload: who, what, which hash, which version, what
# the provider or the operator said.
_KEEP: Final = ("recorded_hash", "submitted_hash", "request_hash", "principal_id", "action",
                "connector", "state", "decision_id", "policy_version", "allowlist_version",
                "approval_id", "decided_by", "reason", "risk", "worker_id", "kind",
                "fencing_generation", "previous_state", "receipt", "provider_receipt",
                "outcome", "resolved_by", "resolution_id", "receipt_check", "provisional",
                "detail", "result", "attempt_id")
_ADMISSION: Final = ("command.admitted", "command.replayed", "command.conflict")


def _entry(event: Mapping[str, Any]) -> dict[str, Any]:
    payload = event.get("payload")
    kept = {k: payload[k] for k in _KEEP if isinstance(payload, dict) and k in payload}
    return {"type": event.get("type"), "at": event.get("recorded_at"), **kept}


def summarize(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The receipt's readable sections, derived from the events alone (the verifier derives
    them again and compares): the admission, every policy decision and its version, the
    approvals (who, when, which hash), every attempt and answer, the operator resolutions,
    and the last word on the outcome."""
    entries = [_entry(e) for e in events]
    admitted = next((x for x in entries if x["type"] == "command.admitted"), None)
    outcome_types = ("command.succeeded", "command.failed", "command.unknown",
                     "command.reconciled", "command.contradicted", "command.expired",
                     "command.denied", "command.review_required")
    return {
        "command": admitted,
        "policy": [x for x in entries if "decision_id" in x or "policy_version" in x],
        "approvals": [x for x in entries if str(x["type"]).startswith("approval.")],
        "attempts": [x for x in entries if str(x["type"]).startswith("command.")
                     and x["type"] not in _ADMISSION and x["type"] != "command.reconciled"],
        "resolutions": [x for x in entries if x["type"] == "command.reconciled"],
        "outcome": next((x for x in reversed(entries) if x["type"] in outcome_types), None),
    }


def _signed_request_hash(summary: Mapping[str, Any]) -> str | None:
    """The request hash the signed events name: the admission's recorded hash, else the
    newest approval's hash, else none."""
    found: Any = None
    if summary["command"] is not None:
        found = summary["command"].get("recorded_hash")
    else:
        hashes = [a["request_hash"] for a in summary["approvals"] if "request_hash" in a]
        found = hashes[-1] if hashes else None
    return found if isinstance(found, str) else None


def bound_hash(bound: Mapping[str, Any]) -> str:
    """The request hash of a command's bound fields (agentledger.canonical.request_hash)."""
    return hashlib.sha256(canonical.canonical_bytes(dict(bound))).hexdigest()


# ---------------------------------------------------------------------------------- export


async def bound_fields(conn: ledger.Conn, cipher: ledger_keys.PayloadCipher, tenant_id: UUID,
                       operation_id: UUID) -> dict[str, Any] | None:
    """The command's bound fields with its decrypted arguments, for ``export(bound=…)``
    (a role that reads the tenant's data keys, ``agentledger_executor``, and the master key);
    None once retention purged the arguments.

    Raises:
        errors.CommandNotFound: no such command in this tenant.
        errors.DecryptionFailed: the master key is not the one that wrapped the tenant's key.
    """
    row = await ledger.load_command(conn, tenant_id, operation_id)
    if row["payload_ciphertext"] is None:
        return None
    arguments = json.loads(await cipher.decrypt(
        conn, tenant_id, operation_id, bytes(row["payload_ciphertext"]),
        row["payload_key_version"]))
    return {"tenant_id": str(tenant_id), "principal_id": row["principal_id"],
            "action": row["action"], "target": row["resource_id"], "arguments": arguments,
            "expected_revision": row["expected_revision"]}


@dataclass(frozen=True)
class Exported:
    """An exported receipt: its object and the exact bytes to write."""

    receipt: dict[str, Any]

    def to_bytes(self) -> bytes:
        return leaf.canonical_json(self.receipt) + b"\n"


def _row_event(row: Any) -> dict[str, Any]:
    return leaf.event_object(event_id=row["event_id"], tenant_id=row["tenant_id"],
                             operation_id=row["operation_id"], type=row["type"],
                             payload=row["payload"], traceparent=row["traceparent"],
                             recorded_at=row["recorded_at"])


async def export(conn: ledger.Conn, tenant_id: UUID, operation_id: UUID, *,
                 bound: Mapping[str, Any] | None = None) -> Exported:
    """Build the receipt of one operation (role ``agentledger_auditor``, tenant-bound).

    Args:
        bound: The command's bound fields (tenant, principal, action, target, arguments,
            expected revision) when the caller could decrypt them; the verifier then checks
            they hash to the admitted request hash. Without them the receipt says why.

    Raises:
        errors.CommandNotFound: the tenant's log holds no event of the operation.
        errors.EvidencePending: an event of the operation is not under a signed checkpoint
            yet (the notary has not reached it).
        errors.EvidenceInvalid: the ledger's own rows do not verify (refused, not exported).
    """
    async with ledger.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["operation_events"], tenant_id, operation_id)
        head = await tx.fetchrow(Q["latest_checkpoint"], tenant_id)
        log_rows = (await tx.fetch(Q["log_leaves"], tenant_id, head["tree_size"])
                    if head is not None else [])
        command = await tx.fetchrow(Q["command"], tenant_id, operation_id)
    if not rows:
        raise errors.CommandNotFound(operation_id=str(operation_id))
    if head is None:
        raise errors.EvidencePending("the tenant's log has no signed checkpoint yet")
    leaves = [bytes(r["leaf_hash"]) for r in log_rows]
    position = {int(r["seq"]): int(r["idx"]) for r in log_rows}
    out_leaves: list[dict[str, Any]] = []
    for row in rows:
        idx = position.get(int(row["seq"]))
        if idx is None:
            raise errors.EvidencePending(
                "an event of the operation is newer than the tenant's last signed checkpoint",
                seq=int(row["seq"]))
        event = _row_event(row)
        if leaf.leaf_hash(event) != leaves[idx] or bytes(row["leaf_hash"]) != leaves[idx]:
            raise errors.EvidenceInvalid(
                f"the audit row at seq {row['seq']} does not match its logged leaf: run "
                "`agentledger evidence verify-chain`", field=f"log position {idx}")
        out_leaves.append({"index": idx, "leaf_hash": leaves[idx].hex(),
                           "inclusion_proof": [h.hex() for h in
                                               merkle.inclusion_proof(leaves, idx)],
                           "event": event})
    events = [x["event"] for x in out_leaves]
    request_hash = _signed_request_hash(summarize(events))
    withheld = None
    if bound is None:
        withheld = ("purged" if command is not None and command["payload_purged_at"] is not None
                    else "encrypted")
    receipt: dict[str, Any] = {
        "format": FORMAT, "version": VERSION,
        "tenant_id": str(tenant_id), "operation_id": str(operation_id),
        "command": {"request_hash": request_hash,
                    "bound": dict(bound) if bound is not None else None, "withheld": withheld},
        "summary": summarize(events),
        "leaves": out_leaves,
        "checkpoint": {"body": head["body"], "signature": bytes(head["signature"]).hex()},
    }
    return Exported(json.loads(leaf.canonical_json(receipt)))


# ---------------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class Verified:
    """What a receipt proved."""

    tenant_id: str
    operation_id: str
    events: int
    checkpoint: checkpoint.Checkpoint
    bound_checked: bool


def _fail(field: str, why: str) -> errors.EvidenceInvalid:
    return errors.EvidenceInvalid(f"{field}: {why}", field=field)


def _first_difference(path: str, got: Any, want: Any) -> str:
    """The JSON path of the first place two values differ."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if got.get(key, _MISSING) != want.get(key, _MISSING):
                return _first_difference(f"{path}.{key}", got.get(key), want.get(key))
    if isinstance(got, list) and isinstance(want, list):
        for i, (a, b) in enumerate(zip(got, want, strict=False)):
            if a != b:
                return _first_difference(f"{path}[{i}]", a, b)
        return f"{path}[{min(len(got), len(want))}]"
    return path


_MISSING: Final = object()


def _hex(value: Any, field: str, size: int = 32) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except (TypeError, ValueError) as exc:
        raise _fail(field, "not hex") from exc
    if len(raw) != size or raw.hex() != value:
        raise _fail(field, f"not {size} bytes in lowercase hex")
    return raw


def verify(data: bytes, trusted: Mapping[str, ed25519.Ed25519PublicKey]) -> Verified:
    """Verify a receipt file offline.

    Raises:
        errors.EvidenceInvalid: it does not verify; ``field`` names the first field at fault.
    """
    try:
        r = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail("(file)", "not a JSON document") from exc
    if not isinstance(r, dict):
        raise _fail("(file)", "not a JSON object")
    for key in _TOP:
        if key not in r:
            raise _fail(key, "missing")
    for key in r:
        if key not in _TOP:
            raise _fail(key, "not a receipt field")
    if r["format"] != FORMAT:
        raise _fail("format", f"not {FORMAT!r}")
    if r["version"] != VERSION:
        raise _fail("version", f"this verifier reads version {VERSION}")
    cp_doc = r["checkpoint"]
    if not isinstance(cp_doc, dict) or set(cp_doc) != {"body", "signature"}:
        raise _fail("checkpoint", "needs exactly body and signature")
    if not isinstance(cp_doc["body"], str):
        raise _fail("checkpoint.body", "not a string")
    cp = checkpoint.verify(cp_doc["body"], _hex(cp_doc["signature"], "checkpoint.signature", 64),
                           dict(trusted))
    tenant, operation = r["tenant_id"], r["operation_id"]
    if cp.tenant_id != tenant:
        raise _fail("tenant_id", "not the tenant of the signed checkpoint")
    leaves = r["leaves"]
    if not isinstance(leaves, list) or not leaves:
        raise _fail("leaves", "no event")
    events: list[dict[str, Any]] = []
    last = -1
    for i, item in enumerate(leaves):
        at = f"leaves[{i}]"
        if not isinstance(item, dict) or set(item) != {"index", "leaf_hash", "inclusion_proof",
                                                        "event"}:
            raise _fail(at, "needs exactly index, leaf_hash, inclusion_proof and event")
        idx = item["index"]
        if not isinstance(idx, int) or isinstance(idx, bool) or idx <= last:
            raise _fail(f"{at}.index", "not a position after the previous leaf's")
        last = idx
        stated = _hex(item["leaf_hash"], f"{at}.leaf_hash")
        proof_doc = item["inclusion_proof"]
        if not isinstance(proof_doc, list):
            raise _fail(f"{at}.inclusion_proof", "not a list")
        proof = [_hex(h, f"{at}.inclusion_proof[{j}]") for j, h in enumerate(proof_doc)]
        try:
            merkle.verify_inclusion(stated, idx, cp.tree_size, proof, cp.root_hash)
        except merkle.ProofError as exc:
            raise _fail(f"{at}.inclusion_proof",
                        f"leaf_hash at index {idx} is not in the checkpoint's tree ({exc})"
                        ) from exc
        event = item["event"]
        if not isinstance(event, dict):
            raise _fail(f"{at}.event", "not an object")
        try:
            recomputed = leaf.leaf_hash(event)
        except errors.ValidationFailed as exc:
            raise _fail(f"{at}.event", "has no canonical form") from exc
        if recomputed != stated:
            raise _fail(f"{at}.event", "does not hash to its leaf_hash: the event was altered")
        if event.get("tenant_id") != tenant:
            raise _fail(f"{at}.event.tenant_id", "another tenant's event")
        if event.get("operation_id") != operation:
            raise _fail(f"{at}.event.operation_id", "another operation's event")
        events.append(event)
    # From here every event is authentic: the readable sections must be what they say.
    want = summarize(events)
    if r["summary"] != want:
        raise _fail(_first_difference("summary", r["summary"], want),
                    "differs from what the signed events say")
    command = r["command"]
    if not isinstance(command, dict) or set(command) != {"request_hash", "bound", "withheld"}:
        raise _fail("command", "needs exactly request_hash, bound and withheld")
    if command["request_hash"] != _signed_request_hash(want):
        raise _fail("command.request_hash", "not the hash the signed events recorded")
    bound = command["bound"]
    if bound is not None:
        if not isinstance(bound, dict):
            raise _fail("command.bound", "not an object")
        try:
            digest = bound_hash(bound)
        except errors.ValidationFailed as exc:
            raise _fail("command.bound", "has no canonical form") from exc
        if digest != command["request_hash"]:
            raise _fail("command.bound", "does not hash to command.request_hash")
        if bound.get("tenant_id") != tenant:
            raise _fail("command.bound.tenant_id", "another tenant")
        if command["withheld"] is not None:
            raise _fail("command.withheld", "the bound fields are present")
    elif command["withheld"] not in WITHHELD:
        raise _fail("command.withheld", f"must say why the bound fields are absent: {WITHHELD}")
    canon = leaf.canonical_json(r) + b"\n"
    if canon != data:
        offset = next((i for i, (x, y) in enumerate(zip(data, canon, strict=False)) if x != y),
                      min(len(data), len(canon)))
        raise _fail("(file)", f"not in canonical form from byte {offset}: the file was edited")
    return Verified(tenant, operation, len(events), cp, bound is not None)


async def status(conn: ledger.Conn, tenant_id: UUID, operation_id: UUID,
                 trusted: Mapping[str, ed25519.Ed25519PublicKey] | None) -> str:
    """One line for ``explain``: whether the operation's evidence verifies — its receipt is
    built and verified as an auditor would (without the bound fields)."""
    try:
        built = await export(conn, tenant_id, operation_id)
    except errors.EvidencePending as exc:
        return f"pending: {exc.message}"
    except errors.EvidenceInvalid as exc:
        return f"BROKEN at {exc.field}: {exc.message}"
    except errors.CommandNotFound:
        return "no audit event"
    if trusted is None:
        return (f"{len(built.receipt['leaves'])} events in the log; signatures not checked "
                "(pass --jwks)")
    try:
        found = verify(built.to_bytes(), trusted)
    except errors.EvidenceInvalid as exc:
        return f"BROKEN at {exc.field}: {exc.message}"
    return (f"verified: {found.events} events under the checkpoint of tree size "
            f"{found.checkpoint.tree_size} signed by {found.checkpoint.key_id} at "
            f"{found.checkpoint.time}")
