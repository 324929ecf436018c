"""The RFC 6962 / 9162 Merkle tree: the proof builders against the verifiers (written from
RFC 9162's algorithms, independently of the builders), the compact range against the
recursive root, and every proof refused once one hash, index or size is changed."""

from __future__ import annotations

import hashlib

import pytest

from agentledger.evidence import merkle

LEAVES = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(70)]


def test_rfc6962_hash_prefixes() -> None:
    assert merkle.leaf_hash(b"") == hashlib.sha256(b"\x00").digest()
    a, b = LEAVES[0], LEAVES[1]
    assert merkle.node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert merkle.root([]) == hashlib.sha256(b"").digest()
    assert merkle.root(LEAVES[:3]) == merkle.node_hash(merkle.node_hash(a, b), LEAVES[2])


def test_compact_range_gives_every_prefix_root() -> None:
    frontier: list[bytes] = []
    for n, h in enumerate(LEAVES):
        frontier = merkle.append(frontier, n, h)
        assert len(frontier) == bin(n + 1).count("1")
        assert merkle.frontier_root(frontier) == merkle.root(LEAVES[:n + 1])


@pytest.mark.parametrize("size", range(1, 71))
def test_every_inclusion_proof_verifies_and_a_changed_one_does_not(size: int) -> None:
    tree = LEAVES[:size]
    r = merkle.root(tree)
    for i in range(size):
        proof = merkle.inclusion_proof(tree, i)
        merkle.verify_inclusion(tree[i], i, size, proof, r)
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(LEAVES[(i + 1) % 70] if size > 1 else b"\0" * 32, i,
                                    size, proof, r)
        if size > 1:
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(tree[i], (i + 1) % size, size, proof, r)
        if proof:
            bad = list(proof)
            bad[-1] = bytes(32)
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(tree[i], i, size, bad, r)
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(tree[i], i, size, proof[:-1], r)


@pytest.mark.parametrize("new", range(1, 71, 3))
def test_every_consistency_proof_verifies_and_a_rewritten_past_does_not(new: int) -> None:
    tree = LEAVES[:new]
    new_root = merkle.root(tree)
    for old in range(1, new + 1):
        old_root = merkle.root(tree[:old])
        proof = merkle.consistency_proof(tree, old)
        merkle.verify_consistency(old, new, old_root, new_root, proof)
        # the same old size, another past: a checkpoint that disagrees about history
        rewritten = list(tree[:old])
        rewritten[old // 2] = merkle.leaf_hash(b"rewritten")
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(old, new, merkle.root(rewritten), new_root, proof)
        if old < new:
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(old, new, old_root, merkle.root(LEAVES[1:new + 1]),
                                          proof)
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(old, new, old_root, new_root, proof[:-1])
