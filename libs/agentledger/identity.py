"""Who is acting for which tenant: session tokens in, a signed identity envelope out (R1.1).

Two JWS formats, both verified with PyJWT and an explicit algorithm allowlist:

- a **session token** from the gateway's identity provider (EdDSA or ES256), verified at
  ingress: ``exp``, ``aud``, ``iss``, ``sub`` and a UUID ``tenant_id`` are required, ``roles``
  is optional. Tenant and principal come only from these verified claims.
- the **identity envelope** ingress signs with its own Ed25519 key (``typ`` =
  ``ENVELOPE_TYPE``, ``iss`` = ``ENVELOPE_ISSUER``, ``aud`` = ``ENVELOPE_AUDIENCE``, short
  ``exp``) binding tenant, principal, operation id, request id, roles — and the content it
  was issued for (``Binding``): the request hash of a gateway's proposal, or the digest of a
  request's goal and resource. It travels in ``ProposalV1.identity``; admission verifies it
  with ``verify_envelope`` and nothing after ingress (the planner least of all) can change who
  acts for which tenant, nor reuse the envelope for other content (a replay with a new amount).

The envelope's request id is the **workflow** whose budgets (R7) the work spends: a request's
own id, a key-less gateway proposal's own id, or — when the gateway names the run its steps
belong to (``AgentLedger-Run``) — the run id ``derive_run_id`` gives for (tenant, principal,
run name), the same for every step of that run and for no other tenant or principal.

Every failure raises ``errors.IdentityRejected``; no PyJWT exception escapes this module.

Importing this module makes PyJWT's ``EdDSA`` verify an Ed25519 public key with libsodium
(``_SodiumEdDSA``) instead of OpenSSL: the same answers in half the CPU, once per proposal
in admission.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import jwt
import nacl.bindings
import nacl.exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from agentledger import canonical, errors

ALGORITHMS: Final = ("EdDSA", "ES256")
ENVELOPE_TYPE: Final = "agentledger-identity+jwt"
ENVELOPE_ISSUER: Final = "agentledger-ingress"
ENVELOPE_AUDIENCE: Final = "agentledger-admission"
# Long enough for the planner to retrieve, call a model and publish under normal lag; short
# enough that a leaked envelope is useless soon. A late request is resubmitted with the same
# idempotency key: same operation id, fresh envelope.
ENVELOPE_TTL_S: Final = 300
# Clock skew tolerated between the identity provider, ingress and admission hosts.
LEEWAY_S: Final = 30
# Past this many seconds from the epoch an instant is nonsense (year ~5138): anything larger
# would overflow a datetime and raise where a typed refusal belongs.
MAX_INSTANT_S: Final = 10**11
# The longest life a token may claim (exp - iat; exp - now without iat). A session token good
# for a century is a password that cannot be revoked; a day covers any gateway session.
MAX_SESSION_LIFETIME_S: Final = 24 * 3600
# Ingress signs envelopes for at most an hour (its envelope_ttl_s setting's bound).
MAX_ENVELOPE_LIFETIME_S: Final = 3600
# Far above any legitimate token (a few hundred bytes) and below ProposalV1.identity's bound.
MAX_TOKEN_CHARS: Final = 4096
MAX_ROLES: Final = 32

# Derives operation ids from idempotency keys; fixed forever, or every retry changes id (R3.1).
OPERATION_NAMESPACE: Final = uuid.UUID("6f2b8f0e-3c1a-5d4e-9a7b-0c8d2e4f6a1b")
# Derives run ids from run names; fixed forever, or a run's later steps open a fresh budget.
# Not OPERATION_NAMESPACE: a run name equal to an idempotency key never names its operation.
RUN_NAMESPACE: Final = uuid.UUID("9c4e2a71-6b3d-5f80-a1e9-3d7c5b2f8e64")
# A run name: what a gateway's own run or task id looks like (a UUID, "ticket-8812:triage"),
# the idempotency key's characters; 128 is far above such ids and keeps logs readable.
RUN_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}$"
_RUN_NAME = re.compile(RUN_NAME_PATTERN)

_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$")
_ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

class _SodiumEdDSA(jwt.algorithms.OKPAlgorithm):
    """PyJWT's ``EdDSA``, with an Ed25519 public key checked by libsodium instead of OpenSSL.

    Why: the check is admission's largest single cost per proposal (the identity envelope),
    and libsodium's takes ~55 µs where OpenSSL's takes ~105 on the bench box (issue 41). It
    accepts no signature OpenSSL refuses: both require a canonical ``S``, and libsodium also
    refuses small-order and non-canonical points, which no key of ours has. Signing, Ed448
    and private keys keep PyJWT's own path.
    """

    def verify(self, msg: str | bytes, key: Any, sig: str | bytes) -> bool:
        if not isinstance(key, ed25519.Ed25519PublicKey):
            return bool(super().verify(msg, key, sig))
        signature = sig.encode() if isinstance(sig, str) else sig
        if len(signature) != 64:  # crypto_sign_open reads the first 64 bytes as the signature
            return False
        try:
            nacl.bindings.crypto_sign_open(
                signature + (msg.encode() if isinstance(msg, str) else msg),
                key.public_bytes_raw())
        except nacl.exceptions.CryptoError:
            return False
        return True


jwt.unregister_algorithm("EdDSA")
jwt.register_algorithm("EdDSA", _SodiumEdDSA())

# Proposals a planner makes from a request get this id (one request, one proposal), so a
# request's envelope can be reused for no other proposal.
PLANNED_PROPOSAL_NAMESPACE: Final = uuid.UUID("0d6c1f7a-4b2e-5c39-8e1d-7a9b3c5e2f40")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class KeySet:
    """Public keys by key id (``kid``), each usable with exactly one algorithm."""

    keys: Mapping[str, PublicKey]

    @classmethod
    def from_pem(cls, pems: Mapping[str, str | bytes]) -> KeySet:
        """Load PEM public keys (Ed25519 or P-256), keyed by ``kid``.

        Raises:
            errors.IdentityRejected: A PEM is not an Ed25519 or P-256 public key.
        """
        keys: dict[str, PublicKey] = {}
        for kid, pem in pems.items():
            try:
                key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str)
                                                        else pem)
            except ValueError as exc:
                raise errors.IdentityRejected(f"key {kid[:64]!r} is not a PEM public key") from exc
            if not isinstance(key, PublicKey) or _algorithm_of(key) is None:
                raise errors.IdentityRejected(f"key {kid[:64]!r} is not Ed25519 or P-256")
            keys[kid] = key
        return cls(keys)

    def select(self, header: Mapping[str, Any], allowed: Sequence[str]) -> tuple[PublicKey, str]:
        """The key named by the token header and the one algorithm it may verify.

        A token without ``kid`` is accepted only when the set holds a single key.
        """
        kid = header.get("kid")
        if kid is None and len(self.keys) == 1:
            key = next(iter(self.keys.values()))
        elif isinstance(kid, str) and kid in self.keys:
            key = self.keys[kid]
        else:
            raise errors.IdentityRejected("token signed by an unknown key")
        algorithm = _algorithm_of(key)
        if algorithm is None or algorithm not in allowed or header.get("alg") != algorithm:
            # Never let the header pick how a key is used (alg=none, HS256 with a public key).
            raise errors.IdentityRejected("token algorithm not allowed for its key")
        return key, algorithm


def _algorithm_of(key: PublicKey | PrivateKey) -> str | None:
    if isinstance(key, ed25519.Ed25519PublicKey | ed25519.Ed25519PrivateKey):
        return "EdDSA"
    if isinstance(key.curve, ec.SECP256R1):
        return "ES256"
    return None


@dataclass(frozen=True)
class Session:
    """A verified session: who the gateway acts for."""

    tenant_id: uuid.UUID
    principal_id: str
    roles: tuple[str, ...]
    expires_at: datetime


@dataclass(frozen=True)
class Identity:
    """The verified content of an identity envelope.

    ``binding`` is what it was issued for: ``Binding("proposal", request hash)`` for a
    gateway's proposal, ``Binding("request", request digest)`` for a request to plan.
    """

    tenant_id: uuid.UUID
    principal_id: str
    operation_id: uuid.UUID
    request_id: uuid.UUID
    roles: tuple[str, ...]
    expires_at: datetime
    binding: Binding


@dataclass(frozen=True)
class Binding:
    """The content an envelope was issued for: its kind and a SHA-256 hex digest."""

    kind: Literal["proposal", "request"]
    digest: str


def proposal_binding(*, tenant_id: uuid.UUID, principal_id: str, action: str, target: str,
                     arguments: Mapping[str, object], expected_revision: str | None
                     ) -> Binding:
    """The binding of a proposal: the request hash (R2.1) over its fields as submitted.

    Raises:
        errors.ValidationFailed: The arguments have no canonical JSON form.
    """
    return Binding("proposal", canonical.request_hash(
        tenant_id=tenant_id, principal_id=principal_id, action=action, target=target,
        arguments=arguments, expected_revision=expected_revision).hex())


def request_binding(*, goal: str, resource: str) -> Binding:
    """The binding of a request to plan: the digest of its goal and resource."""
    return Binding("request", hashlib.sha256(
        canonical.canonical_bytes({"goal": goal, "resource": resource})).hexdigest())


# Ids of key-less gateway Kafka records derive from the record's coordinates, so a
# redelivery after a crash yields the same ids, and the producer can predict them.
RECORD_NAMESPACE: Final = uuid.UUID("3a9e7c51-2d84-5f06-b1c3-9e6f2a8d4b17")


def record_ids(topic: str, partition: int, offset: int) -> tuple[uuid.UUID, uuid.UUID]:
    """(operation id without an idempotency key, proposal id) of a ``gateway.proposals.v1``
    record at these coordinates."""
    seed = f"{topic}:{partition}:{offset}"
    return uuid.uuid5(RECORD_NAMESPACE, seed), uuid.uuid5(RECORD_NAMESPACE, f"proposal:{seed}")


def planned_proposal_id(request_id: uuid.UUID) -> uuid.UUID:
    """The id of the proposal planned from ``request_id`` (admission checks it)."""
    return uuid.uuid5(PLANNED_PROPOSAL_NAMESPACE, str(request_id))


def check_content(found: Identity, binding: Binding) -> None:
    """Refuse a message whose content is not what its envelope was issued for.

    Raises:
        errors.IdentityRejected: Another kind of content, or other content.
    """
    if found.binding.kind != binding.kind or not hmac.compare_digest(
            found.binding.digest, binding.digest):
        raise errors.IdentityRejected(
            f"the {binding.kind} differs from the content its envelope was issued for")


def _decode(token: object, keys: KeySet, *, audience: str, issuer: str,
            allowed: Sequence[str], typ: str | None, now: float | None,
            max_lifetime_s: float) -> dict[str, Any]:
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise errors.IdentityRejected("token missing or too long")
    try:
        # The header alone picks the key: PyJWT's own parse and checks of the header segment,
        # without decoding the payload and signature twice (`decode` below decodes them once
        # and verifies the signature over the same header bytes; issue 41).
        header = jwt.get_unverified_header(token.partition(".")[0] + "..")
        if typ is not None and header.get("typ") != typ:
            raise errors.IdentityRejected("token of the wrong type")
        key, algorithm = keys.select(header, allowed)
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=[algorithm], audience=audience, issuer=issuer,
            # Time claims are checked below against `now`, so tests and replays are exact.
            options={"require": ["exp", "aud", "iss", "sub"], "verify_exp": False,
                     "verify_nbf": False, "verify_iat": False},
        )
    except errors.IdentityRejected:
        raise
    except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
        raise errors.IdentityRejected(f"token rejected: {type(exc).__name__}") from exc
    current = time.time() if now is None else now
    exp, nbf = claims.get("exp"), claims.get("nbf")
    # JSON decoding accepts NaN and Infinity: a NaN compares false with everything, so it
    # would pass every check below (issue 38). Only finite numbers are instants.
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name)
        if value is not None and not _instant(value):
            raise errors.IdentityRejected(f"claim {name} is not a finite number of seconds")
    if not isinstance(exp, int | float) or current >= exp + LEEWAY_S:
        raise errors.IdentityRejected("token expired")
    if nbf is not None and current < nbf - LEEWAY_S:
        raise errors.IdentityRejected("token not valid yet")
    iat = claims.get("iat")
    if iat is not None and iat > current + LEEWAY_S:
        raise errors.IdentityRejected("token issued in the future")
    if exp - (current if iat is None else iat) > max_lifetime_s + LEEWAY_S:
        raise errors.IdentityRejected("token lifetime exceeds the allowed maximum")
    return claims


def _instant(value: object) -> bool:
    """A JWT NumericDate this process can use: an int or float, finite, within datetime's
    range (a bool is not a number here)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and abs(value) < MAX_INSTANT_S)


def _uuid_claim(claims: Mapping[str, Any], name: str) -> uuid.UUID:
    value = claims.get(name)
    if not isinstance(value, str):
        raise errors.IdentityRejected(f"claim {name} missing or not a string")
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise errors.IdentityRejected(f"claim {name} is not a UUID") from exc


def is_principal_id(value: str) -> bool:
    """Whether a session could name ``value`` as its principal (its ``sub``)."""
    return _PRINCIPAL.fullmatch(value) is not None


def is_role_name(value: str) -> bool:
    """Whether a session could carry ``value`` among its roles."""
    return _ROLE.fullmatch(value) is not None


def _principal(claims: Mapping[str, Any]) -> str:
    sub = claims.get("sub")
    if not isinstance(sub, str) or not _PRINCIPAL.fullmatch(sub):
        raise errors.IdentityRejected("claim sub is not a valid principal id")
    return sub


def _roles(claims: Mapping[str, Any]) -> tuple[str, ...]:
    roles = claims.get("roles", [])
    if (not isinstance(roles, list) or len(roles) > MAX_ROLES
            or not all(isinstance(r, str) and _ROLE.fullmatch(r) for r in roles)):
        raise errors.IdentityRejected("claim roles is not a list of role names")
    return tuple(roles)


def _binding(claims: Mapping[str, Any]) -> Binding:
    kind, digest = claims.get("binds"), claims.get("content")
    if kind not in ("proposal", "request") or not isinstance(digest, str) \
            or not _DIGEST.fullmatch(digest):
        raise errors.IdentityRejected("claims binds/content missing: the envelope binds no content")
    return Binding(kind, digest)


def _expiry(claims: Mapping[str, Any]) -> datetime:
    return datetime.fromtimestamp(float(claims["exp"]), UTC)


def verify_session(
    token: object, keys: KeySet, *, audience: str, issuer: str, now: float | None = None,
) -> Session:
    """Verify a gateway session token.

    Args:
        token: The compact JWS (without ``Bearer``).
        keys: The identity provider's public keys, by ``kid``.
        audience: The ``aud`` ingress expects.
        issuer: The ``iss`` ingress trusts.
        now: Unix time to verify at (default: the clock).

    Raises:
        errors.IdentityRejected: Forged, expired, wrong audience/issuer, disallowed algorithm,
            unknown key, missing/malformed claims, issued in the future, or claiming a life
            longer than ``MAX_SESSION_LIFETIME_S``.
    """
    claims = _decode(token, keys, audience=audience, issuer=issuer, allowed=ALGORITHMS,
                     typ=None, now=now, max_lifetime_s=MAX_SESSION_LIFETIME_S)
    return Session(tenant_id=_uuid_claim(claims, "tenant_id"), principal_id=_principal(claims),
                   roles=_roles(claims), expires_at=_expiry(claims))


def verify_envelope(token: object, public_keys: KeySet, *, now: float | None = None) -> Identity:
    """Verify an identity envelope signed by ingress (what admission calls).

    Args:
        token: ``ProposalV1.identity`` / ``RequestV1.identity``.
        public_keys: Ingress' Ed25519 public keys, by ``kid``.
        now: Unix time to verify at (default: the clock).

    Raises:
        errors.IdentityRejected: Not signed by an ingress key, tampered, expired, not an
            envelope (e.g. a session token), or missing claims.
    """
    claims = _decode(token, public_keys, audience=ENVELOPE_AUDIENCE, issuer=ENVELOPE_ISSUER,
                     allowed=("EdDSA",), typ=ENVELOPE_TYPE, now=now,
                     max_lifetime_s=MAX_ENVELOPE_LIFETIME_S)
    return Identity(
        tenant_id=_uuid_claim(claims, "tenant_id"), principal_id=_principal(claims),
        operation_id=_uuid_claim(claims, "operation_id"),
        request_id=_uuid_claim(claims, "request_id"), roles=_roles(claims),
        expires_at=_expiry(claims), binding=_binding(claims),
    )


def check_bound(found: Identity, *, tenant_id: uuid.UUID, principal_id: str,
                operation_id: uuid.UUID) -> None:
    """Refuse a message whose identity fields differ from its verified envelope.

    Raises:
        errors.IdentityRejected: Tenant, principal or operation id is not the envelope's.
    """
    if (found.tenant_id, found.principal_id, found.operation_id) != (
            tenant_id, principal_id, operation_id):
        raise errors.IdentityRejected("message identity differs from its signed envelope")


class EnvelopeSigner:
    """Signs identity envelopes with ingress' Ed25519 key."""

    def __init__(self, private_pem: str | bytes, kid: str, *, ttl_s: int = ENVELOPE_TTL_S
                 ) -> None:
        """Args:
            private_pem: Ingress' Ed25519 private key (PKCS#8 PEM, unencrypted).
            kid: Its key id, as configured on the verifying side.
            ttl_s: Envelope lifetime in seconds.
        """
        key = serialization.load_pem_private_key(
            private_pem.encode() if isinstance(private_pem, str) else private_pem, password=None)
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise errors.IdentityRejected("the envelope key must be Ed25519")
        self._key, self.kid, self.ttl_s = key, kid, ttl_s

    def sign(self, *, tenant_id: uuid.UUID, principal_id: str, operation_id: uuid.UUID,
             request_id: uuid.UUID, binding: Binding, roles: Sequence[str] = (),
             now: float | None = None) -> str:
        """The compact JWS binding these fields and ``binding`` until ``now + ttl_s``."""
        issued = int(time.time() if now is None else now)
        return jwt.encode(
            {"iss": ENVELOPE_ISSUER, "aud": ENVELOPE_AUDIENCE, "sub": principal_id,
             "tenant_id": str(tenant_id), "operation_id": str(operation_id),
             "request_id": str(request_id), "roles": list(roles),
             "binds": binding.kind, "content": binding.digest,
             # Its own id: the request id is a run's, shared by the envelopes of its steps.
             "iat": issued, "exp": issued + self.ttl_s, "jti": str(uuid.uuid4())},
            self._key, algorithm="EdDSA", headers={"kid": self.kid, "typ": ENVELOPE_TYPE},
        )


def derive_operation_id(tenant_id: uuid.UUID, principal_id: str, idempotency_key: str
                        ) -> uuid.UUID:
    """The operation id of an intent: the same (tenant, principal, key) always gives the same."""
    return uuid.uuid5(OPERATION_NAMESPACE, f"{tenant_id}\x1f{principal_id}\x1f{idempotency_key}")


# What an idempotency key may be (ingress' Idempotency-Key header, the gateway record's
# header, MCP's _meta key): what a retry must repeat verbatim; the CRM's key alphabet.
IDEMPOTENCY_KEY_PATTERN: Final = r"^[A-Za-z0-9._:~-]{1,255}$"
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)


def is_idempotency_key(value: str) -> bool:
    """Whether ``value`` may be an idempotency key (:data:`IDEMPOTENCY_KEY_PATTERN`)."""
    return _IDEMPOTENCY_KEY.fullmatch(value) is not None


def submission_ids(tenant_id: uuid.UUID, principal_id: str, key: str | None, *,
                   record: tuple[str, int, int] | None = None) -> tuple[uuid.UUID, uuid.UUID]:
    """(operation id, proposal id) of a submitted proposal.

    The operation id is the key's (:func:`derive_operation_id`) when there is a key, else the
    gateway record's (:func:`record_ids`, so a redelivered record yields the same ids), else
    new. The proposal id is the record's, else new.
    """
    from_record = record_ids(*record) if record is not None else None
    if key is not None:
        operation_id = derive_operation_id(tenant_id, principal_id, key)
    else:
        operation_id = from_record[0] if from_record is not None else uuid.uuid4()
    return operation_id, (from_record[1] if from_record is not None else uuid.uuid4())


def is_run_name(value: str) -> bool:
    """Whether ``value`` may name a run: 1-128 characters of ``A-Z a-z 0-9 . _ : ~ -``,
    starting with a letter or digit."""
    return _RUN_NAME.fullmatch(value) is not None


def derive_run_id(tenant_id: uuid.UUID, principal_id: str, run: str) -> uuid.UUID:
    """The run id (the budgets' workflow id) of the run a principal names ``run``: the same
    (tenant, principal, name) always gives the same id; another tenant or principal naming
    the same string gets another id, so never shares the run's budget.

    Raises:
        errors.ValidationFailed: ``run`` is not a run name (``is_run_name``).
    """
    if not is_run_name(run):
        raise errors.ValidationFailed(
            "a run name is 1-128 characters of A-Z a-z 0-9 . _ : ~ -, starting with a letter "
            "or digit")
    return uuid.uuid5(RUN_NAMESPACE, f"{tenant_id}\x1f{principal_id}\x1f{run}")


# --- development and test helpers ------------------------------------------------------------


def generate_keypair(algorithm: str = "EdDSA") -> tuple[str, str]:
    """A new (private PEM, public PEM) pair for ``EdDSA`` (Ed25519) or ``ES256`` (P-256)."""
    private: PrivateKey
    if algorithm == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        raise ValueError(f"unsupported algorithm {algorithm!r}")
    private_pem = private.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()).decode()
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private_pem, public_pem


def issue_session(private_pem: str, kid: str, *, tenant_id: uuid.UUID, subject: str,
                  audience: str, issuer: str, ttl_s: int = 3600, roles: Sequence[str] = (),
                  now: float | None = None) -> str:
    """A session token as a development identity provider would issue it (tests, demos)."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError("session keys are Ed25519 or P-256")
    issued = int(time.time() if now is None else now)
    return jwt.encode(
        {"iss": issuer, "aud": audience, "sub": subject, "tenant_id": str(tenant_id),
         "roles": list(roles), "iat": issued, "exp": issued + ttl_s},
        key, algorithm=_algorithm_of(key), headers={"kid": kid},
    )
