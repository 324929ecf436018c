"""The notary's Ed25519 signing keys and the JWKS an auditor verifies with.

A key directory holds one PEM file per key, ``<kid>.pem`` (PKCS #8, mode 0600, readable by
the notary's operating-system user only: no database role can read a file), and the name of
the key that signs now in ``active``. The key id is the key's RFC 7638 JWK thumbprint.

Rotation: ``agentledger evidence keygen`` adds a key and makes it active; the old one keeps
verifying the checkpoints it signed. Retiring a private key: ``keygen --retire KID`` keeps
only its public half (``<kid>.pub.pem``), so the JWKS still lists it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentledger import canonical, errors

ACTIVE = "active"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_raw(key: ed25519.Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: ed25519.Ed25519PublicKey) -> str:
    """RFC 7638 thumbprint: base64url(SHA-256 of the canonical required members)."""
    members = {"crv": "Ed25519", "kty": "OKP", "x": _b64url(public_raw(key))}
    return _b64url(hashlib.sha256(canonical.canonical_bytes(members)).digest())


def jwk(key: ed25519.Ed25519PublicKey) -> dict[str, str]:
    """The RFC 8037 JWK of a public key."""
    return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(public_raw(key)),
            "kid": key_id(key), "alg": "EdDSA", "use": "sig"}


@dataclass(frozen=True)
class Signer:
    """The active signing key."""

    key_id: str
    private: ed25519.Ed25519PrivateKey

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def generate(directory: Path, *, activate: bool = True) -> str:
    """Create a key in ``directory`` (made 0700), make it active, return its id."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = ed25519.Ed25519PrivateKey.generate()
    kid = key_id(private.public_key())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path = directory / f"{kid}.pem"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    if activate:
        tmp = directory / f".{ACTIVE}.tmp"
        tmp.write_text(kid + "\n")
        tmp.replace(directory / ACTIVE)
    return kid


def retire(directory: Path, kid: str) -> None:
    """Keep only the public half of a key that no longer signs.

    Raises:
        errors.ConfigurationError: it is the active key, or there is no such key.
    """
    if active_id(directory) == kid:
        raise errors.ConfigurationError("the active key cannot be retired: rotate first")
    path = directory / f"{kid}.pem"
    if not path.exists():
        raise errors.ConfigurationError("no such private key", key_id=kid)
    public = _load_private(path).public_key()
    (directory / f"{kid}.pub.pem").write_bytes(public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    path.unlink()


def active_id(directory: Path) -> str | None:
    """The id of the key that signs now, if the directory names one."""
    try:
        return (directory / ACTIVE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _load_private(path: Path) -> ed25519.Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm, OSError) as exc:
        raise errors.ConfigurationError(f"{path.name} is not a readable PEM private key") \
            from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise errors.ConfigurationError(f"{path.name} is not an Ed25519 key")
    return key


def load_signer(directory: Path) -> Signer:
    """The active key of a key directory.

    Raises:
        errors.ConfigurationError: no active key, or its file is missing or not Ed25519.
    """
    kid = active_id(directory)
    if kid is None:
        raise errors.ConfigurationError(
            f"no active signing key in {directory}: run `agentledger evidence keygen`")
    private = _load_private(directory / f"{kid}.pem")
    if key_id(private.public_key()) != kid:
        raise errors.ConfigurationError("the active key file does not hold the key it names")
    return Signer(kid, private)


def public_keys(directory: Path) -> list[ed25519.Ed25519PublicKey]:
    """Every key of a directory, active, rotated and retired, as public keys."""
    found: list[ed25519.Ed25519PublicKey] = []
    for path in sorted(directory.glob("*.pem")):
        if path.name.endswith(".pub.pem"):
            key = serialization.load_pem_public_key(path.read_bytes())
            if isinstance(key, ed25519.Ed25519PublicKey):
                found.append(key)
        else:
            found.append(_load_private(path).public_key())
    return found


def jwks(directory: Path) -> dict[str, Any]:
    """The JWKS (RFC 7517) of every key of a directory."""
    return {"keys": [jwk(k) for k in public_keys(directory)]}


def load_jwks(path: Path) -> dict[str, ed25519.Ed25519PublicKey]:
    """The trusted keys of a JWKS file, by key id.

    Raises:
        errors.ConfigurationError: not a JWKS of Ed25519 keys whose ids are their thumbprints.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = doc["keys"]
        out: dict[str, ed25519.Ed25519PublicKey] = {}
        for entry in entries:
            if entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
                continue
            key = ed25519.Ed25519PublicKey.from_public_bytes(_unb64url(entry["x"]))
            if entry.get("kid", key_id(key)) != key_id(key):
                raise errors.ConfigurationError("a JWKS key's kid is not its thumbprint",
                                                kid=str(entry.get("kid"))[:64])
            out[key_id(key)] = key
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise errors.ConfigurationError(f"{path} is not a readable JWKS file") from exc
    if not out:
        raise errors.ConfigurationError(f"{path} holds no Ed25519 key")
    return out
