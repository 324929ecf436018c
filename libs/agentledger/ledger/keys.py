"""Payload encryption at rest for the ledger (R3.6): per-tenant data keys, cached unwrapped.

The primitives are in :mod:`agentledger.crypto`; this module stores and finds the tenant's
wrapped keys in the ledger and keeps unwrapped ones in a bounded in-memory cache.
"""

from __future__ import annotations

from collections import OrderedDict
from uuid import UUID

from agentledger import crypto
from agentledger.ledger import repository

# Unwrapping costs a round trip and an AES operation; a process serves few tenants at a
# time. 1,024 keys are 32 KiB of key material held in memory.
CACHE_CAPACITY = 1024


class PayloadCipher:
    """Encrypts and decrypts command payloads with the tenant's data key."""

    def __init__(self, master: crypto.MasterKey, *, capacity: int = CACHE_CAPACITY) -> None:
        self._master = master
        self._capacity = capacity
        self._keys: OrderedDict[tuple[UUID, int | None], crypto.DataKey] = OrderedDict()

    async def _key(
        self, conn: repository.Conn, tenant_id: UUID, version: int | None
    ) -> crypto.DataKey:
        cached = self._keys.get((tenant_id, version))
        if cached is not None:
            self._keys.move_to_end((tenant_id, version))
            return cached

        def make_wrapped() -> tuple[bytes, str]:
            wrapped = crypto.wrap_data_key(self._master, crypto.generate_data_key(tenant_id))
            return wrapped.wrapped, wrapped.master_key_id

        stored = await repository.data_key(conn, tenant_id, make_wrapped, version=version)
        key = crypto.unwrap_data_key(self._master, crypto.WrappedDataKey(
            tenant_id=tenant_id, version=stored.version,
            master_key_id=stored.master_key_id, wrapped=stored.wrapped,
        ))
        self._keys[(tenant_id, version)] = key
        self._keys[(tenant_id, key.version)] = key
        while len(self._keys) > self._capacity:
            self._keys.popitem(last=False)
        return key

    def holds(self, tenant_id: UUID) -> bool:
        """Whether the tenant's current data key is in memory (:meth:`warm` is a no-op)."""
        return (tenant_id, None) in self._keys

    async def warm(self, conn: repository.Conn, tenant_id: UUID) -> None:
        """Have the tenant's current data key in memory (reading or creating it when it is
        not), so a later :meth:`encrypt` inside a transaction does no I/O."""
        await self._key(conn, tenant_id, None)

    async def encrypt(
        self, conn: repository.Conn, tenant_id: UUID, operation_id: UUID, plaintext: bytes
    ) -> tuple[bytes, int]:
        """Encrypt for one ledger row; returns the ciphertext and the key version used."""
        key = await self._key(conn, tenant_id, None)
        blob = crypto.encrypt_payload(
            key, tenant_id=tenant_id, operation_id=operation_id, plaintext=plaintext
        )
        return blob, key.version

    async def decrypt(
        self, conn: repository.Conn, tenant_id: UUID, operation_id: UUID,
        ciphertext: bytes, key_version: int,
    ) -> bytes:
        """Decrypt a row's payload.

        Raises:
            DecryptionFailed: wrong key, tampering, or a ciphertext moved to another row.
        """
        key = await self._key(conn, tenant_id, key_version)
        return crypto.decrypt_payload(
            key, tenant_id=tenant_id, operation_id=operation_id, ciphertext=ciphertext
        )
