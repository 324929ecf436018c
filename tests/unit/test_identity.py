"""Session tokens and identity envelopes: every bad token is an IdentityRejected, nothing else."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable

import jwt
import pytest
from cryptography.hazmat.primitives import hashes, hmac, serialization

from agentledger import errors, identity

ISS, AUD = "https://idp.example", "agentledger-ingress"
TENANT = uuid.uuid4()
NOW = time.time()

EDDSA_PRIVATE, EDDSA_PUBLIC = identity.generate_keypair("EdDSA")
ES256_PRIVATE, ES256_PUBLIC = identity.generate_keypair("ES256")
OTHER_PRIVATE, _ = identity.generate_keypair("EdDSA")
KEYS = identity.KeySet.from_pem({"ed": EDDSA_PUBLIC, "ec": ES256_PUBLIC})


def session(private: str = EDDSA_PRIVATE, kid: str = "ed", **overrides: object) -> str:
    claims: dict[str, object] = {"iss": ISS, "aud": AUD, "sub": "user:alice",
                                 "tenant_id": str(TENANT), "roles": ["agent"],
                                 "iat": int(NOW), "exp": int(NOW) + 600}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    algorithm = "ES256" if private == ES256_PRIVATE else "EdDSA"
    return jwt.encode(claims, _private(private), algorithm=algorithm, headers={"kid": kid})  # type: ignore[arg-type]


def verify(token: object) -> identity.Session:
    return identity.verify_session(token, KEYS, audience=AUD, issuer=ISS, now=NOW)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, object], claims: dict[str, object], signature: bytes = b"") -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}.{b64(signature)}"


def test_valid_eddsa_and_es256_sessions() -> None:
    for token in (session(), session(ES256_PRIVATE, "ec")):
        found = verify(token)
        assert (found.tenant_id, found.principal_id, found.roles) == (TENANT, "user:alice", ("agent",))


def test_issue_session_helper_round_trips() -> None:
    token = identity.issue_session(ES256_PRIVATE, "ec", tenant_id=TENANT, subject="svc:bot",
                                   audience=AUD, issuer=ISS, now=NOW)
    assert verify(token).principal_id == "svc:bot"


def _hs256_with_public_key() -> str:
    header = {"alg": "HS256", "typ": "JWT", "kid": "ed"}
    claims = {"iss": ISS, "aud": AUD, "sub": "user:mallory", "tenant_id": str(TENANT), "exp": int(NOW) + 600}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}".encode()
    mac = hmac.HMAC(EDDSA_PUBLIC.encode(), hashes.SHA256())
    mac.update(signing_input)
    return signing_input.decode() + "." + b64(mac.finalize())


def _alg_none() -> str:
    claims = {"iss": ISS, "aud": AUD, "sub": "user:mallory", "tenant_id": str(TENANT), "exp": int(NOW) + 600}
    return unsigned({"alg": "none", "typ": "JWT", "kid": "ed"}, claims)


def _tampered() -> str:
    head, body, sig = session().split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    claims["tenant_id"] = str(uuid.uuid4())
    return f"{head}.{b64(json.dumps(claims).encode())}.{sig}"


def _eddsa_header_on_es256_key() -> str:
    _, body, sig = session().split(".")
    return f"{b64(json.dumps({'alg': 'EdDSA', 'kid': 'ec'}).encode())}.{body}.{sig}"


def _segments(rebuild: Callable[[str, str, str], str]) -> str:
    head, body, sig = session().split(".")
    return rebuild(head, body, sig)


BAD_TOKENS = {
    "forged (unknown signer, known kid)": lambda: session(OTHER_PRIVATE, "ed"),
    "unknown kid": lambda: session(kid="nope"),
    "tampered claims": _tampered,
    "expired": lambda: session(exp=int(NOW) - 3600),
    "not valid yet": lambda: session(nbf=int(NOW) + 3600),
    "wrong audience": lambda: session(aud="someone-else"),
    "wrong issuer": lambda: session(iss="https://evil.example"),
    "alg none": _alg_none,
    "HS256 signed with the public key": _hs256_with_public_key,
    "alg swapped to the other key": _eddsa_header_on_es256_key,
    "missing exp": lambda: session(exp=None),
    "missing sub": lambda: session(sub=None),
    "missing aud": lambda: session(aud=None),
    "missing iss": lambda: session(iss=None),
    "missing tenant": lambda: session(tenant_id=None),
    "tenant not a uuid": lambda: session(tenant_id="acme"),
    "roles not a list": lambda: session(roles="admin"),
    "principal with spaces": lambda: session(sub="user alice"),
    "garbage": lambda: "not.a.jwt",
    # The key is picked from the header segment alone; the other segments are still checked.
    "payload not base64url": lambda: _segments(lambda h, b, s: f"{h}.!!!!{b}.{s}"),
    "signature not base64url": lambda: _segments(lambda h, b, s: f"{h}.{b}.{s}!!"),
    "two segments": lambda: _segments(lambda h, b, s: f"{h}.{b}"),
    "four segments": lambda: _segments(lambda h, b, s: f"{h}.{b}.{s}.{s}"),
    "header alone": lambda: _segments(lambda h, b, s: f"{h}.."),
    "empty": lambda: "",
    "not a string": lambda: None,
    "too long": lambda: "a" * 5000,
    # Issue 17: accepted before.
    "a hundred-year lifetime": lambda: session(exp=int(NOW) + 100 * 365 * 86400),
    "a lifetime of 25 h": lambda: session(exp=int(NOW) + 25 * 3600),
    "no iat and a hundred years left": lambda: session(iat=None, exp=int(NOW) + 100 * 365 * 86400),
    "issued in the future": lambda: session(iat=int(NOW) + 3600, exp=int(NOW) + 7200),
    "iat not a number": lambda: session(iat="yesterday"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_bad_session_tokens_are_rejected(case: str) -> None:
    with pytest.raises(errors.IdentityRejected):
        verify(BAD_TOKENS[case]())


def test_kid_may_be_omitted_only_with_a_single_key() -> None:
    token = jwt.encode({"iss": ISS, "aud": AUD, "sub": "u", "tenant_id": str(TENANT), "exp": int(NOW) + 60},
                       _private(EDDSA_PRIVATE), algorithm="EdDSA")
    single = identity.KeySet.from_pem({"only": EDDSA_PUBLIC})
    assert identity.verify_session(token, single, audience=AUD, issuer=ISS, now=NOW).principal_id == "u"
    with pytest.raises(errors.IdentityRejected):
        verify(token)


def _private(pem: str) -> object:
    return serialization.load_pem_private_key(pem.encode(), password=None)


def test_non_curve_keys_are_refused_at_load() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(errors.IdentityRejected):
        identity.KeySet.from_pem({"rsa": rsa_pem})
    with pytest.raises(errors.IdentityRejected):
        identity.KeySet.from_pem({"junk": "not a pem"})


# --- envelope ----------------------------------------------------------------------------

INGRESS_PRIVATE, INGRESS_PUBLIC = identity.generate_keypair()
INGRESS_KEYS = identity.KeySet.from_pem({"ingress-1": INGRESS_PUBLIC})
SIGNER = identity.EnvelopeSigner(INGRESS_PRIVATE, "ingress-1", ttl_s=300)


def envelope(**overrides: object) -> tuple[str, dict[str, object]]:
    fields: dict[str, object] = {"tenant_id": TENANT, "principal_id": "user:alice",
                                 "operation_id": uuid.uuid4(), "request_id": uuid.uuid4(),
                                 "roles": ("agent",), "now": NOW,
                                 "binding": identity.Binding("proposal", "a" * 64)}
    fields.update(overrides)
    return SIGNER.sign(**fields), fields  # type: ignore[arg-type]


def test_envelope_round_trip() -> None:
    token, fields = envelope()
    found = identity.verify_envelope(token, INGRESS_KEYS, now=NOW + 10)
    assert (found.tenant_id, found.principal_id, found.operation_id, found.request_id, found.roles) == (
        fields["tenant_id"], fields["principal_id"], fields["operation_id"], fields["request_id"], ("agent",))
    header = jwt.get_unverified_header(token)
    assert (header["alg"], header["kid"], header["typ"]) == ("EdDSA", "ingress-1", identity.ENVELOPE_TYPE)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["iss"], claims["aud"], claims["exp"] - claims["iat"]) == (
        "agentledger-ingress", "agentledger-admission", 300)


def test_envelope_tampering_is_rejected() -> None:
    token, _ = envelope()
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    for name, value in (("tenant_id", str(uuid.uuid4())), ("sub", "user:mallory"),
                        ("operation_id", str(uuid.uuid4())), ("roles", ["admin"])):
        forged = f"{head}.{b64(json.dumps({**claims, name: value}).encode())}.{sig}"
        with pytest.raises(errors.IdentityRejected):
            identity.verify_envelope(forged, INGRESS_KEYS, now=NOW)


def test_envelope_expiry_and_wrong_audience() -> None:
    token, _ = envelope()
    with pytest.raises(errors.IdentityRejected):
        identity.verify_envelope(token, INGRESS_KEYS, now=NOW + 300 + identity.LEEWAY_S + 1)
    private = _private(INGRESS_PRIVATE)
    for bad in ({"aud": "agentledger-executor"}, {"iss": "agentledger-planner"}):
        claims = {**jwt.decode(token, options={"verify_signature": False}), **bad}
        forged = jwt.encode(claims, private, algorithm="EdDSA",  # type: ignore[arg-type]
                            headers={"kid": "ingress-1", "typ": identity.ENVELOPE_TYPE})
        with pytest.raises(errors.IdentityRejected):
            identity.verify_envelope(forged, INGRESS_KEYS, now=NOW)


def test_a_session_token_is_not_an_envelope() -> None:
    # Even signed by the ingress key itself, with the envelope's audience: typ must match.
    token = identity.issue_session(INGRESS_PRIVATE, "ingress-1", tenant_id=TENANT, subject="u",
                                   audience=identity.ENVELOPE_AUDIENCE, issuer=identity.ENVELOPE_ISSUER, now=NOW)
    with pytest.raises(errors.IdentityRejected):
        identity.verify_envelope(token, INGRESS_KEYS, now=NOW)


def test_envelope_from_another_signer_is_rejected() -> None:
    other = identity.EnvelopeSigner(OTHER_PRIVATE, "ingress-1")
    token = other.sign(tenant_id=TENANT, principal_id="u", operation_id=uuid.uuid4(),
                       request_id=uuid.uuid4(), binding=identity.Binding("proposal", "a" * 64), now=NOW)
    with pytest.raises(errors.IdentityRejected):
        identity.verify_envelope(token, INGRESS_KEYS, now=NOW)


def test_check_bound_refuses_any_difference() -> None:
    token, fields = envelope()
    found = identity.verify_envelope(token, INGRESS_KEYS, now=NOW)
    identity.check_bound(found, tenant_id=TENANT, principal_id="user:alice",
                         operation_id=fields["operation_id"])  # type: ignore[arg-type]
    for change in ({"tenant_id": uuid.uuid4()}, {"principal_id": "user:bob"}, {"operation_id": uuid.uuid4()}):
        bound = {"tenant_id": TENANT, "principal_id": "user:alice", "operation_id": fields["operation_id"], **change}
        with pytest.raises(errors.IdentityRejected):
            identity.check_bound(found, **bound)  # type: ignore[arg-type]


def test_operation_id_is_stable_per_tenant_principal_and_key() -> None:
    one = identity.derive_operation_id(TENANT, "user:alice", "k-1")
    assert one == identity.derive_operation_id(TENANT, "user:alice", "k-1")
    assert one.version == 5
    assert len({one, identity.derive_operation_id(TENANT, "user:alice", "k-2"),
                identity.derive_operation_id(TENANT, "user:bob", "k-1"),
                identity.derive_operation_id(uuid.uuid4(), "user:alice", "k-1")}) == 4
    # Pinned: changing the namespace or the layout would re-key every in-flight retry.
    assert str(identity.derive_operation_id(uuid.UUID(int=1), "p", "k")) == str(
        uuid.uuid5(identity.OPERATION_NAMESPACE, f"{uuid.UUID(int=1)}\x1fp\x1fk"))


def test_a_day_long_session_within_the_skew_is_accepted() -> None:
    verify(session(iat=int(NOW) + 20, exp=int(NOW) + 20 + identity.MAX_SESSION_LIFETIME_S))


def test_an_envelope_longer_than_ingress_may_sign_is_rejected() -> None:
    long = identity.EnvelopeSigner(INGRESS_PRIVATE, "ingress-1", ttl_s=2 * 3600)
    token = long.sign(tenant_id=TENANT, principal_id="user:alice", operation_id=uuid.uuid4(),
                      request_id=uuid.uuid4(), binding=identity.Binding("proposal", "a" * 64), now=NOW)
    with pytest.raises(errors.IdentityRejected, match="lifetime"):
        identity.verify_envelope(token, INGRESS_KEYS, now=NOW)



def test_an_envelope_carries_the_content_it_was_issued_for() -> None:
    binding = identity.proposal_binding(tenant_id=TENANT, principal_id="user:alice", action="crm.note.create",
                                        target="c-1", arguments={"body": "hi"}, expected_revision=None)
    token, _ = envelope(binding=binding)
    found = identity.verify_envelope(token, INGRESS_KEYS, now=NOW)
    assert found.binding == binding and binding.kind == "proposal" and len(binding.digest) == 64
    identity.check_content(found, binding)
    for other in (identity.proposal_binding(tenant_id=TENANT, principal_id="user:alice", action="crm.note.create",
                                            target="c-1", arguments={"body": "hi!"}, expected_revision=None),
                  identity.proposal_binding(tenant_id=TENANT, principal_id="user:alice", action="crm.note.create",
                                            target="c-1", arguments={"body": "hi"}, expected_revision=""),
                  identity.Binding("request", binding.digest)):
        with pytest.raises(errors.IdentityRejected, match="content its envelope was issued for"):
            identity.check_content(found, other)


def test_an_envelope_binding_no_content_is_rejected() -> None:
    import jwt
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(INGRESS_PRIVATE.encode(), password=None)
    claims = {"iss": identity.ENVELOPE_ISSUER, "aud": identity.ENVELOPE_AUDIENCE, "sub": "user:alice",
              "tenant_id": str(TENANT), "operation_id": str(uuid.uuid4()), "request_id": str(uuid.uuid4()),
              "roles": [], "iat": NOW, "exp": NOW + 60}
    for extra in ({}, {"binds": "proposal"}, {"binds": "anything", "content": "a" * 64},
                  {"binds": "request", "content": "A" * 64}):
        token = jwt.encode({**claims, **extra}, key, algorithm="EdDSA",  # type: ignore[arg-type]
                           headers={"kid": "ingress-1", "typ": identity.ENVELOPE_TYPE})
        with pytest.raises(errors.IdentityRejected, match="binds no content"):
            identity.verify_envelope(token, INGRESS_KEYS, now=NOW)


def test_a_request_binding_covers_goal_and_resource_and_planned_ids_are_stable() -> None:
    a = identity.request_binding(goal="refund inv-7", resource="c-1")
    assert a == identity.request_binding(goal="refund inv-7", resource="c-1")
    assert a != identity.request_binding(goal="refund inv-8", resource="c-1")
    assert a != identity.request_binding(goal="refund inv-7", resource="c-2")
    rid = uuid.uuid4()
    assert identity.planned_proposal_id(rid) == identity.planned_proposal_id(rid) != identity.planned_proposal_id(uuid.uuid4())


def test_submission_ids_are_the_keys_then_the_records_then_new() -> None:
    tenant = uuid.uuid4()
    keyed, proposal = identity.submission_ids(tenant, "user:alice", "k-1")
    assert keyed == identity.derive_operation_id(tenant, "user:alice", "k-1")
    assert proposal != identity.submission_ids(tenant, "user:alice", "k-1")[1]  # new each time
    # A gateway record: the ids ingress derived before they had one home, unchanged.
    seed = "gateway.proposals.v1:3:42"
    by_record = identity.submission_ids(tenant, "user:alice", None,
                                        record=("gateway.proposals.v1", 3, 42))
    assert by_record == (uuid.uuid5(identity.RECORD_NAMESPACE, seed),
                         uuid.uuid5(identity.RECORD_NAMESPACE, f"proposal:{seed}"))
    assert by_record == identity.record_ids("gateway.proposals.v1", 3, 42)
    with_key = identity.submission_ids(tenant, "user:alice", "k-1",
                                       record=("gateway.proposals.v1", 3, 42))
    assert with_key == (keyed, by_record[1])


def _raw_session(**claims: object) -> str:
    """A token signed by a trusted key whose JSON claims are written verbatim (json.dumps
    writes NaN and Infinity, which PyJWT's decoder reads back)."""
    body = {"iss": ISS, "aud": AUD, "sub": "user:alice", "tenant_id": str(TENANT),
            "roles": ["agent"], "iat": int(NOW), "exp": int(NOW) + 600, **claims}
    header = {"alg": "EdDSA", "typ": "JWT", "kid": "ed"}
    signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}"
    key = _private(EDDSA_PRIVATE)
    return f"{signing}.{b64(key.sign(signing.encode()))}"  # type: ignore[union-attr]


@pytest.mark.parametrize("claims", [
    {"exp": float("nan")}, {"exp": float("inf")}, {"exp": 1e300},
    {"iat": float("nan")}, {"iat": float("-inf")}, {"nbf": float("nan")},
    {"exp": True}, {"iat": "0"},
])
def test_a_non_finite_or_absurd_time_claim_is_a_typed_refusal(claims: dict[str, object]) -> None:
    # Issue 38 (on 85a9f05: exp=NaN passed every check and the lifetime cap, exp=1e300 raised
    # an untyped OverflowError).
    with pytest.raises(errors.IdentityRejected):
        verify(_raw_session(**claims))


@pytest.mark.parametrize("claims", [{"sub": "user:alice\n"}, {"roles": ["agent\n"]}])
def test_a_trailing_newline_is_no_principal_or_role(claims: dict[str, object]) -> None:
    # Issue 38: `$` matches before a final newline; the patterns now match the whole value.
    with pytest.raises(errors.IdentityRejected):
        verify(session(**claims))
