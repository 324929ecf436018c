"""The Merkle tree of a transparency log, exactly as RFC 6962 section 2.1 defines it (and
RFC 9162 section 2.1 keeps): leaf and node hashes with distinct prefixes, audit paths
(inclusion proofs), consistency proofs between two tree sizes, and their verification.

Written here rather than taken from PyPI: no maintained Python package implements these
RFCs on their own (sigstore's is internal to its client), the definitions are a page long,
and the tests check the proof builders against the verifiers (which follow RFC 9162's
algorithms, written independently of the builders) for every size and index up to 70.

A *compact range* (``frontier``) is what appending needs: the roots of the perfect subtrees
that make up a tree of ``size`` leaves, largest first (one per set bit of ``size``). The
notary keeps it with each checkpoint so the next one costs O(new leaves * log n).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

LEAF_PREFIX: Final = b"\x00"
NODE_PREFIX: Final = b"\x01"
HASH_SIZE: Final = 32


class ProofError(Exception):
    """A proof does not verify; the message says which check failed."""


def leaf_hash(data: bytes) -> bytes:
    """MTH of one entry: SHA-256(0x00 || data)."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An interior node: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def empty_root() -> bytes:
    """MTH({}) = SHA-256 of the empty string."""
    return hashlib.sha256(b"").digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1)."""
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) over leaf *hashes* (each already ``leaf_hash`` of its entry)."""
    n = len(leaves)
    if n == 0:
        return empty_root()
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(root(leaves[:k]), root(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(m, D[n]): the audit path of leaf ``index`` in the tree of ``leaves``."""
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError("index outside the tree")
    if n == 1:
        return []
    k = _split(n)
    if index < k:
        return [*inclusion_proof(leaves[:k], index), root(leaves[k:])]
    return [*inclusion_proof(leaves[k:], index - k), root(leaves[:k])]


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """PROOF(m, D[n]): that the first ``old_size`` leaves are a prefix of ``leaves``."""
    n = len(leaves)
    if not 0 < old_size <= n:
        raise ValueError("old size outside the tree")
    return _subproof(old_size, leaves, True)


def _subproof(m: int, leaves: Sequence[bytes], complete: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if complete else [root(leaves)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, leaves[:k], complete), root(leaves[k:])]
    return [*_subproof(m - k, leaves[k:], False), root(leaves[:k])]


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes],
                     expected_root: bytes) -> None:
    """RFC 9162 2.1.3.2: the audit path leads from ``leaf`` at ``index`` to ``expected_root``.

    Raises:
        ProofError: it does not (a wrong hash, index, size or path length).
    """
    if not 0 <= index < size:
        raise ProofError("the leaf index is outside the tree")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if len(p) != HASH_SIZE:
            raise ProofError("a proof hash is not 32 bytes")
        if sn == 0:
            raise ProofError("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short")
    if r != expected_root:
        raise ProofError("the inclusion proof does not lead to the root")


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> None:
    """RFC 9162 2.1.4.2: the tree of ``new_size`` leaves extends the one of ``old_size``.

    Raises:
        ProofError: it does not: the two roots disagree about the first ``old_size`` leaves.
    """
    if not 0 < old_size <= new_size:
        raise ProofError("the sizes are not in order")
    if old_size == new_size:
        if proof:
            raise ProofError("a proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError("two roots of one size differ")
        return
    if not proof or any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("the consistency proof is empty or malformed")
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError("the older checkpoint's root is not a prefix of the newer tree")
    if sr != new_root:
        raise ProofError("the consistency proof does not lead to the newer root")


def append(frontier: Sequence[bytes], size: int, leaf: bytes) -> list[bytes]:
    """The compact range of ``size + 1`` leaves from that of ``size`` and one more leaf."""
    out = list(frontier)
    if len(out) != bin(size).count("1"):
        raise ValueError("the frontier does not match the size")
    node, s = leaf, size
    while s & 1:  # merge equal-sized perfect subtrees, smallest first
        node = node_hash(out.pop(), node)
        s >>= 1
    out.append(node)
    return out


def frontier_root(frontier: Sequence[bytes]) -> bytes:
    """MTH of the tree a compact range describes."""
    if not frontier:
        return empty_root()
    r = frontier[-1]
    for left in reversed(frontier[:-1]):
        r = node_hash(left, r)
    return r
