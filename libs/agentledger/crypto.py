"""Payload encryption at rest with per-tenant data keys (R3.6).

Envelope encryption: a master key from configuration wraps one random data key per
(tenant, key version); the data key encrypts command payloads. The ledger stores only
wrapped keys, so a database dump without the master key reveals no payload.

Why AES-GCM with random 96-bit nonces is safe here: the risk is a nonce collision under
one key, whose probability after q messages is about q^2 / 2^97. Every tenant has its own
data key (rotated by bumping the key version), and NIST SP 800-38D caps random-nonce use
at 2^32 messages per key, where the collision probability is still under 2^-33. One
payload per admitted command keeps a tenant key orders of magnitude below that cap.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentledger import errors

KEY_BYTES: Final = 32  # AES-256
NONCE_BYTES: Final = 12  # the GCM standard nonce; other lengths go through GHASH
FORMAT_VERSION: Final = 1  # first byte of every ciphertext, so the format can evolve
_HEADER: Final = bytes([FORMAT_VERSION])
_TAG_BYTES: Final = 16
_DATA_KEY_AD: Final = b"agentledger/data-key/"
_PAYLOAD_AD: Final = b"agentledger/payload/"


def _tenant_text(tenant_id: UUID | str) -> str:
    try:
        return str(tenant_id if isinstance(tenant_id, UUID) else UUID(tenant_id))
    except ValueError as exc:
        raise errors.ValidationFailed("tenant_id is not a UUID") from exc


def _seal(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return _HEADER + nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data)


def _open(key: bytes, blob: bytes, associated_data: bytes, what: str) -> bytes:
    if len(blob) < 1 + NONCE_BYTES + _TAG_BYTES or blob[0] != FORMAT_VERSION:
        raise errors.DecryptionFailed(f"{what} is not in a known ciphertext format")
    nonce, body = blob[1 : 1 + NONCE_BYTES], blob[1 + NONCE_BYTES :]
    try:
        return AESGCM(key).decrypt(nonce, body, associated_data)
    except InvalidTag as exc:
        raise errors.DecryptionFailed() from exc


@dataclass(frozen=True)
class MasterKey:
    """The key-encryption key, from configuration; it never encrypts payloads itself.

    Attributes:
        key_id: Names the master key, stored with every key it wraps (for rotation).
    """

    key: bytes = field(repr=False)
    key_id: str = "master-1"

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise errors.ValidationFailed(f"a master key is {KEY_BYTES} bytes")

    @classmethod
    def from_b64(cls, value: str, *, key_id: str = "master-1") -> MasterKey:
        """Build the master key from its base64 configuration value.

        Raises:
            errors.ValidationFailed: Not base64, or not 32 bytes once decoded.
        """
        try:
            raw = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise errors.ValidationFailed("the master key is not valid base64") from exc
        return cls(key=raw, key_id=key_id)


@dataclass(frozen=True)
class DataKey:
    """An unwrapped per-tenant data key; lives only in memory."""

    tenant_id: UUID
    version: int
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class WrappedDataKey:
    """A data key encrypted by the master key, as stored in the ledger.

    Attributes:
        wrapped: format version || nonce || encrypted key + tag.
    """

    tenant_id: UUID
    version: int
    master_key_id: str
    wrapped: bytes


def _data_key_ad(tenant: str, version: int) -> bytes:
    # Binding the version too means a wrapped key cannot be relabelled as another version.
    return _DATA_KEY_AD + f"{tenant}/v{version}".encode()


def generate_data_key(tenant_id: UUID | str, *, version: int = 1) -> DataKey:
    """A fresh random data key for a tenant."""
    return DataKey(tenant_id=UUID(_tenant_text(tenant_id)), version=version,
                   key=AESGCM.generate_key(bit_length=KEY_BYTES * 8))


def wrap_data_key(master: MasterKey, data_key: DataKey) -> WrappedDataKey:
    """Encrypt a data key under the master key, bound to its tenant and version."""
    tenant = str(data_key.tenant_id)
    return WrappedDataKey(
        tenant_id=data_key.tenant_id,
        version=data_key.version,
        master_key_id=master.key_id,
        wrapped=_seal(master.key, data_key.key, _data_key_ad(tenant, data_key.version)),
    )


def unwrap_data_key(master: MasterKey, wrapped: WrappedDataKey) -> DataKey:
    """Decrypt a wrapped data key.

    Raises:
        errors.DecryptionFailed: Another master key, or the record was tampered with or
            relabelled to another tenant or version.
    """
    if wrapped.master_key_id != master.key_id:
        raise errors.DecryptionFailed(
            "the data key is wrapped by another master key",
            master_key_id=wrapped.master_key_id[:64])
    tenant = str(wrapped.tenant_id)
    key = _open(master.key, wrapped.wrapped, _data_key_ad(tenant, wrapped.version), "data key")
    if len(key) != KEY_BYTES:
        raise errors.DecryptionFailed("the unwrapped data key has the wrong length")
    return DataKey(tenant_id=wrapped.tenant_id, version=wrapped.version, key=key)


def _payload_ad(tenant_id: UUID | str, operation_id: UUID | str) -> bytes:
    try:
        operation = str(operation_id if isinstance(operation_id, UUID) else UUID(operation_id))
    except ValueError as exc:
        raise errors.ValidationFailed("operation_id is not a UUID") from exc
    return _PAYLOAD_AD + f"{_tenant_text(tenant_id)}/{operation}".encode()


def _check_owner(data_key: DataKey, tenant_id: UUID | str) -> None:
    if str(data_key.tenant_id) != _tenant_text(tenant_id):
        raise errors.DecryptionFailed("the data key belongs to another tenant")


def encrypt_payload(
    data_key: DataKey, *, tenant_id: UUID | str, operation_id: UUID | str, plaintext: bytes
) -> bytes:
    """Encrypt a payload for one ledger row.

    The associated data binds tenant and operation id: the ciphertext decrypts only for
    the row it was written for.

    Returns:
        format version (1 byte) || random nonce (12 bytes) || ciphertext + tag.

    Raises:
        errors.DecryptionFailed: The data key belongs to another tenant (a wiring bug that
            must not produce a ciphertext nobody can read back).
    """
    _check_owner(data_key, tenant_id)
    return _seal(data_key.key, plaintext, _payload_ad(tenant_id, operation_id))


def decrypt_payload(
    data_key: DataKey, *, tenant_id: UUID | str, operation_id: UUID | str, ciphertext: bytes
) -> bytes:
    """Decrypt a payload written by ``encrypt_payload`` for the same row.

    Raises:
        errors.DecryptionFailed: Wrong key, tampered bytes, or a ciphertext moved to
            another tenant or operation.
    """
    _check_owner(data_key, tenant_id)
    return _open(data_key.key, ciphertext, _payload_ad(tenant_id, operation_id), "payload")


WrappedKeyLookup = Callable[[UUID, int], WrappedDataKey]
"""Returns the stored wrapped key of (tenant, version); raises if there is none."""


class KeyRing:
    """Unwrapped data keys cached in memory per (tenant, key version).

    Unwrapping costs a storage round trip; a worker serves few tenants at a time, so a
    small LRU cache removes almost all of them.
    """

    # Bounds memory (and how many keys sit unwrapped in RAM) on a worker that sees many
    # tenants; 1,024 keys are 32 KiB of key material.
    DEFAULT_CAPACITY: Final = 1024

    def __init__(
        self, master: MasterKey, lookup: WrappedKeyLookup, *, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        """Create a key ring.

        Args:
            master: The master key that wrapped the stored data keys.
            lookup: Loads a wrapped key from storage; called once per cache miss.
            capacity: How many unwrapped keys to keep.
        """
        self._master = master
        self._lookup = lookup
        self._capacity = capacity
        self._keys: OrderedDict[tuple[UUID, int], DataKey] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant_id: UUID | str, version: int) -> DataKey:
        """The data key of a tenant at a key version.

        Raises:
            errors.DecryptionFailed: The stored key cannot be unwrapped, or the lookup
                returned a key for another tenant or version.
        """
        slot = (UUID(_tenant_text(tenant_id)), version)
        with self._lock:
            cached = self._keys.get(slot)
            if cached is not None:
                self._keys.move_to_end(slot)
                return cached
        wrapped = self._lookup(*slot)
        if (wrapped.tenant_id, wrapped.version) != slot:
            raise errors.DecryptionFailed("the key lookup returned another tenant's key")
        key = unwrap_data_key(self._master, wrapped)
        with self._lock:
            self._keys[slot] = key
            self._keys.move_to_end(slot)
            while len(self._keys) > self._capacity:
                self._keys.popitem(last=False)
        return key

    def forget(self, tenant_id: UUID | str) -> None:
        """Drop every cached key of a tenant (after rotation or tenant deletion)."""
        tenant = UUID(_tenant_text(tenant_id))
        with self._lock:
            for slot in [s for s in self._keys if s[0] == tenant]:
                del self._keys[slot]
