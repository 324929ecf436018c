"""Payload encryption at rest: per-tenant keys, ciphertexts bound to their row (R3.6)."""

from __future__ import annotations

import base64
import dataclasses
import os
import uuid

import pytest

from agentledger import crypto, errors

TENANT = uuid.uuid4()
OTHER_TENANT = uuid.uuid4()
OPERATION = uuid.uuid4()
MASTER = crypto.MasterKey.from_b64(base64.b64encode(os.urandom(32)).decode())
PLAINTEXT = b'{"customer_id":"c-1","body":"PLAINTEXT-MARKER"}'


def encrypt(key: crypto.DataKey, **row: object) -> bytes:
    fields: dict[str, object] = {"tenant_id": TENANT, "operation_id": OPERATION, **row}
    return crypto.encrypt_payload(key, plaintext=PLAINTEXT, **fields)  # type: ignore[arg-type]


def decrypt(key: crypto.DataKey, blob: bytes, **row: object) -> bytes:
    fields: dict[str, object] = {"tenant_id": TENANT, "operation_id": OPERATION, **row}
    return crypto.decrypt_payload(key, ciphertext=blob, **fields)  # type: ignore[arg-type]


def test_round_trip_and_format() -> None:
    key = crypto.generate_data_key(TENANT)
    blob = encrypt(key)
    assert blob[0] == crypto.FORMAT_VERSION
    assert len(blob) == 1 + 12 + len(PLAINTEXT) + 16
    assert b"PLAINTEXT-MARKER" not in blob
    assert decrypt(key, blob) == PLAINTEXT
    assert decrypt(key, blob, tenant_id=str(TENANT).upper(), operation_id=str(OPERATION)) == \
        PLAINTEXT


def test_nonces_are_fresh() -> None:
    key = crypto.generate_data_key(TENANT)
    assert encrypt(key)[1:13] != encrypt(key)[1:13]


@pytest.mark.parametrize("position", [0, 1, 13, -1])
def test_tampered_ciphertext_fails(position: int) -> None:
    key = crypto.generate_data_key(TENANT)
    blob = bytearray(encrypt(key))
    blob[position] ^= 0x01
    with pytest.raises(errors.DecryptionFailed):
        decrypt(key, bytes(blob))


@pytest.mark.parametrize("blob", [b"", b"\x01", b"\x01" + b"\x00" * 20])
def test_truncated_ciphertext_fails(blob: bytes) -> None:
    with pytest.raises(errors.DecryptionFailed):
        decrypt(crypto.generate_data_key(TENANT), blob)


def test_ciphertext_moved_to_another_operation_fails() -> None:
    key = crypto.generate_data_key(TENANT)
    with pytest.raises(errors.DecryptionFailed):
        decrypt(key, encrypt(key), operation_id=uuid.uuid4())


def test_ciphertext_moved_to_another_tenant_fails() -> None:
    key = crypto.generate_data_key(TENANT)
    blob = encrypt(key)
    # Even with the same key bytes relabelled for the other tenant, the AD still differs.
    relabelled = dataclasses.replace(key, tenant_id=OTHER_TENANT)
    with pytest.raises(errors.DecryptionFailed):
        decrypt(relabelled, blob, tenant_id=OTHER_TENANT)
    with pytest.raises(errors.DecryptionFailed):
        decrypt(key, blob, tenant_id=OTHER_TENANT)


def test_wrong_data_key_fails() -> None:
    blob = encrypt(crypto.generate_data_key(TENANT))
    with pytest.raises(errors.DecryptionFailed):
        decrypt(crypto.generate_data_key(TENANT), blob)


def test_encrypting_with_another_tenants_key_is_refused() -> None:
    with pytest.raises(errors.DecryptionFailed):
        encrypt(crypto.generate_data_key(OTHER_TENANT))


def test_wrap_unwrap() -> None:
    key = crypto.generate_data_key(TENANT, version=3)
    wrapped = crypto.wrap_data_key(MASTER, key)
    assert (wrapped.tenant_id, wrapped.version, wrapped.master_key_id) == (TENANT, 3, "master-1")
    assert key.key not in wrapped.wrapped
    assert crypto.unwrap_data_key(MASTER, wrapped) == key
    assert "key=" not in repr(key)
    assert "key=" not in repr(MASTER)


@pytest.mark.parametrize(
    "change",
    [{"tenant_id": OTHER_TENANT}, {"version": 4}, {"master_key_id": "master-2"},
     {"wrapped": b"\x01" + b"\x00" * 60}],
)
def test_relabelled_or_tampered_wrapped_key_fails(change: dict[str, object]) -> None:
    wrapped = crypto.wrap_data_key(MASTER, crypto.generate_data_key(TENANT, version=3))
    with pytest.raises(errors.DecryptionFailed):
        crypto.unwrap_data_key(MASTER, dataclasses.replace(wrapped, **change))  # type: ignore[arg-type]


def test_unwrap_with_another_master_key_fails() -> None:
    wrapped = crypto.wrap_data_key(MASTER, crypto.generate_data_key(TENANT))
    other = crypto.MasterKey(key=os.urandom(32), key_id=MASTER.key_id)
    with pytest.raises(errors.DecryptionFailed):
        crypto.unwrap_data_key(other, wrapped)


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"short").decode()])
def test_master_key_configuration_is_checked(value: str) -> None:
    with pytest.raises(errors.ValidationFailed):
        crypto.MasterKey.from_b64(value)


class Store:
    """An in-memory stand-in for the ledger's wrapped-key table that counts lookups."""

    def __init__(self) -> None:
        self.rows: dict[tuple[uuid.UUID, int], crypto.WrappedDataKey] = {}
        self.lookups = 0

    def add(self, tenant: uuid.UUID, version: int) -> crypto.DataKey:
        key = crypto.generate_data_key(tenant, version=version)
        self.rows[(tenant, version)] = crypto.wrap_data_key(MASTER, key)
        return key

    def __call__(self, tenant: uuid.UUID, version: int) -> crypto.WrappedDataKey:
        self.lookups += 1
        return self.rows[(tenant, version)]


def test_key_ring_caches_per_tenant_and_version() -> None:
    store = Store()
    k1, k2, other = store.add(TENANT, 1), store.add(TENANT, 2), store.add(OTHER_TENANT, 1)
    ring = crypto.KeyRing(MASTER, store)
    assert ring.get(TENANT, 1) == k1
    assert ring.get(str(TENANT), 1) == k1
    assert store.lookups == 1
    assert ring.get(TENANT, 2) == k2
    assert ring.get(OTHER_TENANT, 1) == other
    assert store.lookups == 3
    ring.forget(TENANT)
    assert ring.get(TENANT, 1) == k1
    assert ring.get(OTHER_TENANT, 1) == other
    assert store.lookups == 4


def test_key_ring_is_bounded() -> None:
    store = Store()
    tenants = [uuid.uuid4() for _ in range(3)]
    for tenant in tenants:
        store.add(tenant, 1)
    ring = crypto.KeyRing(MASTER, store, capacity=2)
    for tenant in tenants:
        ring.get(tenant, 1)
    ring.get(tenants[2], 1)
    assert store.lookups == 3
    ring.get(tenants[0], 1)  # evicted as least recently used
    assert store.lookups == 4


def test_key_ring_refuses_a_lookup_for_the_wrong_slot() -> None:
    store = Store()
    store.add(OTHER_TENANT, 1)
    ring = crypto.KeyRing(MASTER, lambda _tenant, _version: store.rows[(OTHER_TENANT, 1)])
    with pytest.raises(errors.DecryptionFailed):
        ring.get(TENANT, 1)
