"""Ed25519 tokens are checked by libsodium, and it answers as OpenSSL does (issue 41)."""

from __future__ import annotations

import random
import uuid

import jwt
import nacl.bindings
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import errors, identity

# The order of Ed25519's base point (RFC 8032, 5.1).
L = 2**252 + 27742317777372353535851937790883648493


def openssl(key: ed25519.Ed25519PublicKey, msg: bytes, sig: bytes) -> bool:
    try:
        key.verify(sig, msg)
    except InvalidSignature:
        return False
    return True


def test_pyjwt_eddsa_is_the_libsodium_check() -> None:
    assert isinstance(jwt.get_algorithm_by_name("EdDSA"), identity._SodiumEdDSA)


def test_an_envelope_is_verified_by_libsodium(monkeypatch: pytest.MonkeyPatch) -> None:
    private, public = identity.generate_keypair("EdDSA")
    keys = identity.KeySet.from_pem({"k": public})
    signer = identity.EnvelopeSigner(private, "k")
    binding = identity.request_binding(goal="g", resource="r")
    token = signer.sign(tenant_id=uuid.uuid4(), principal_id="user:a",
                        operation_id=uuid.uuid4(), request_id=uuid.uuid4(), binding=binding)
    calls: list[bytes] = []
    real = nacl.bindings.crypto_sign_open

    def spy(signed: bytes, pk: bytes) -> bytes:
        calls.append(pk)
        return real(signed, pk)

    monkeypatch.setattr(nacl.bindings, "crypto_sign_open", spy)
    assert identity.verify_envelope(token, keys).binding == binding
    assert len(calls) == 1
    head, payload, sig = token.split(".")
    forged = f"{head}.{payload}.{sig[:-2]}{'A' if sig[-2] != 'A' else 'B'}{sig[-1]}"
    with pytest.raises(errors.IdentityRejected):
        identity.verify_envelope(forged, keys)
    assert len(calls) == 2


def test_libsodium_and_openssl_agree() -> None:
    """Honest signatures, every kind of tampering, and signatures no honest signer makes."""
    rng = random.Random(41)
    check = identity._SodiumEdDSA()
    key = ed25519.Ed25519PrivateKey.generate()
    public, other = key.public_key(), ed25519.Ed25519PrivateKey.generate().public_key()
    cases: list[tuple[ed25519.Ed25519PublicKey, bytes, bytes]] = []
    for size in (0, 1, 64, 737, 4096):
        msg = rng.randbytes(size)
        sig = key.sign(msg)
        cases += [(public, msg, sig), (other, msg, sig)]
        for _ in range(8):  # one bit flipped in the signature
            bit = rng.randrange(512)
            flipped = bytearray(sig)
            flipped[bit // 8] ^= 1 << (bit % 8)
            cases.append((public, msg, bytes(flipped)))
        if msg:
            cases.append((public, bytes([msg[0] ^ 1]) + msg[1:], sig))
        cases.append((public, msg + b"x", sig))
        cases += [(public, msg, sig[:63]), (public, msg, sig + b"\0"), (public, msg, b""),
                  (public, msg, bytes(64))]
        # The same point R with S + L: a second encoding of a valid S (malleability).
        s = int.from_bytes(sig[32:], "little") + L
        cases.append((public, msg, sig[:32] + s.to_bytes(32, "little")))
    verdicts = [(check.verify(msg, k, sig), openssl(k, msg, sig)) for k, msg, sig in cases]
    assert all(ours == theirs for ours, theirs in verdicts), [
        i for i, (ours, theirs) in enumerate(verdicts) if ours != theirs]
    assert sum(ours for ours, _ in verdicts) == 5  # exactly the honest ones


def test_other_keys_keep_pyjwts_own_path() -> None:
    """Signing, and a private key given for checking (PyJWT takes its public half), are PyJWT's."""
    key = ed25519.Ed25519PrivateKey.generate()
    token = jwt.encode({"sub": "s"}, key, algorithm="EdDSA")
    assert jwt.decode(token, key.public_key(), algorithms=["EdDSA"]) == {"sub": "s"}
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, ed25519.Ed25519PrivateKey.generate().public_key(),
                   algorithms=["EdDSA"])
    check, msg = identity._SodiumEdDSA(), b"m"
    assert check.verify(msg, key, key.sign(msg))
    assert not check.verify(msg, key, ed25519.Ed25519PrivateKey.generate().sign(msg))
