"""``verify-chain``: walk one tenant's log in the database and report the first broken entry.

Four checks, in this order, each stopping at the first fault:

1. positions: the log's positions run 0, 1, 2 … with increasing ``seq`` (a deleted or
   reordered position is named);
2. rows: the tenant's audit rows, in ``seq`` order, are exactly the logged ones (up to the
   notary's cursor: a row at or below it that the log lacks was inserted by hand), and each
   row's canonical form (recomputed here, in Python, independently of the database's own
   hash) hashes to its logged leaf — a row edited, deleted, inserted or moved is named by its
   position and ``seq``;
3. checkpoints: each is signed by a trusted key and its root is the root of the log's first
   ``tree_size`` leaves;
4. consistency: each checkpoint extends the one before (an RFC 9162 consistency proof built
   from the log and verified against both signed roots): two checkpoints that disagree about
   the past are named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import errors, sql
from agentledger.evidence import checkpoint, leaf, merkle
from agentledger.ledger import repository as ledger

Q = sql.load(Path(__file__).with_name("queries.sql"))


@dataclass(frozen=True)
class ChainReport:
    """A log that verified: how much of it, under how many checkpoints."""

    tenant_id: UUID
    entries: int
    checkpoints: int
    tree_size: int
    root_hash: str
    unsequenced: int  # rows newer than the last checkpoint (not yet covered)


def _broken(where: str, why: str) -> errors.EvidenceInvalid:
    return errors.EvidenceInvalid(f"{where}: {why}", field=where)


async def verify_chain(conn: ledger.Conn, tenant_id: UUID,
                       trusted: Mapping[str, ed25519.Ed25519PublicKey]) -> ChainReport:
    """Verify a tenant's log (role ``agentledger_auditor``).

    Raises:
        errors.EvidenceInvalid: the first broken entry (``field`` names it).
    """
    async with ledger.transaction(conn, tenant_id) as tx:
        # The cursor first: every row at or below it is in the log read after it (the log
        # only grows), so a row there that the log lacks was put there by hand.
        cursor = int(await tx.fetchval(Q["cursor"]) or 0)
        cps = await tx.fetch(Q["checkpoints"], tenant_id)
        log_rows = await tx.fetch(Q["log_leaves"], tenant_id, 2**62)
        rows = await tx.fetch(Q["tenant_events"], tenant_id, 2**62)
    if not cps:
        if any(int(r["seq"]) <= cursor for r in rows):
            raise _broken(f"audit row seq {rows[0]['seq']}",
                          "a row the notary has passed but the log never held (inserted)")
        return ChainReport(tenant_id, 0, 0, 0, merkle.empty_root().hex(), len(rows))
    last_seq = max(int(cps[-1]["last_seq"]), cursor,
                   max((int(r["seq"]) for r in log_rows), default=0))
    covered = [r for r in rows if int(r["seq"]) <= last_seq]
    # 1. positions
    leaves: list[bytes] = []
    prev_seq = 0
    for expected, r in enumerate(log_rows):
        if int(r["idx"]) != expected:
            raise _broken(f"log position {expected}", "missing from the log (deleted)")
        if int(r["seq"]) <= prev_seq:
            raise _broken(f"log position {expected}", "out of seq order (reordered)")
        prev_seq = int(r["seq"])
        leaves.append(bytes(r["leaf_hash"]))
    # 2. rows against positions. Two rows at one seq (the column is an identity, so only a
    # hand can put them there) are named as such first: which of the two the scan meets
    # first is the server's choice, and the report must not depend on it.
    seqs: set[int] = set()
    for r in covered:
        if int(r["seq"]) in seqs:
            raise _broken(f"audit row seq {r['seq']}",
                          "a second row at one position: a row the log never held (inserted)")
        seqs.add(int(r["seq"]))
    for i, r in enumerate(log_rows):
        seq = int(r["seq"])
        row = covered[i] if i < len(covered) else None
        where = f"log position {i} (seq {seq})"
        if row is None or int(row["seq"]) > seq:
            raise _broken(where, "its audit row is gone (deleted, or its seq was changed)")
        if int(row["seq"]) < seq:
            raise _broken(f"audit row seq {row['seq']}",
                          "a row the log never held (inserted, or moved here)")
        event = leaf.event_object(event_id=row["event_id"], tenant_id=row["tenant_id"],
                                  operation_id=row["operation_id"], type=row["type"],
                                  payload=row["payload"], traceparent=row["traceparent"],
                                  recorded_at=row["recorded_at"])
        try:
            recomputed = leaf.leaf_hash(event)
        except errors.ValidationFailed as exc:
            raise _broken(where, "the row has no canonical form") from exc
        if recomputed != leaves[i]:
            detail = ("its content was edited" if bytes(row["leaf_hash"]) == leaves[i]
                      else "its content and its stored hash were rewritten, or rows were "
                      "swapped")
            raise _broken(where, f"the row does not hash to the logged leaf: {detail} "
                          f"(event {row['event_id']})")
    if len(covered) > len(log_rows):
        extra = covered[len(log_rows)]
        raise _broken(f"audit row seq {extra['seq']}", "a row the log never held (inserted)")
    # 3. checkpoints, 4. consistency. The log's prefix roots come from one pass over the
    # leaves (a compact range); a checkpoint whose root is not its prefix's is then told
    # apart: it disagrees with the checkpoint before it (a consistency proof fails), or with
    # the log only.
    previous: checkpoint.Checkpoint | None = None
    frontier: list[bytes] = []
    grown = 0
    for row in cps:
        size = int(row["tree_size"])
        where = f"checkpoint at tree size {size}"
        try:
            cp = checkpoint.verify(row["body"], bytes(row["signature"]), dict(trusted),
                                   field=where)
        except errors.EvidenceInvalid as exc:
            raise _broken(where, exc.message) from exc
        if cp.tree_size != size or cp.tenant_id != str(tenant_id) \
                or cp.root_hash != bytes(row["root_hash"]):
            raise _broken(where, "its stored columns are not what was signed")
        if size > len(leaves):
            raise _broken(where, f"signs {size} entries but the log holds {len(leaves)}")
        while grown < size:
            frontier = merkle.append(frontier, grown, leaves[grown])
            grown += 1
        if merkle.frontier_root(frontier) != cp.root_hash:
            if previous is not None:
                try:
                    merkle.verify_consistency(
                        previous.tree_size, size, previous.root_hash, cp.root_hash,
                        merkle.consistency_proof(leaves[:size], previous.tree_size))
                except merkle.ProofError as exc:
                    raise _broken(where, "disagrees about the past with the checkpoint at "
                                  f"tree size {previous.tree_size} (consistency proof: {exc})"
                                  ) from exc
            raise _broken(where, "its signed root is not the root of the log's first "
                          f"{size} entries")
        previous = cp
    assert previous is not None
    return ChainReport(tenant_id, len(log_rows), len(cps), previous.tree_size,
                       previous.root_hash.hex(), len(rows) - len(covered))
