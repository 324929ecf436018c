"""The conformance kit: does a real endpoint keep the contract its connector declares?

Recovery trusts the declaration (R5.5, R6.4): a ``keyed`` connector is resent after a lost
answer, a lookup's "found" becomes ``succeeded``, ``If-Match`` protects an approved change.
Declaring more than the endpoint does turns recovery into duplicates or invented outcomes,
so the kit checks each declared claim against the endpoint, for real:

- ``applies``: the sample call is applied;
- ``keyed`` — ``dedupes``: the same call resent under the same key answers the same receipt
  (an endpoint that ignores the key makes a second effect, with another receipt);
- ``lookup`` — ``lookup_finds``: a lookup of the applied call's key finds it, with its
  receipt. This is the lost-answer case: losing an answer on the wire does not change what
  the provider committed, so the lookup sees the same state either way;
- ``lookup`` — ``lookup_not_found``: a key never sent is not found (a lookup that says
  "found" for everything would turn every lost answer into an invented success);
- ``If-Match`` (a stale sample given) — ``if_match``: a call naming a revision that is not
  the current one is refused as a failed precondition, and (with lookup) nothing was applied;
- ``fencing`` — ``fencing``: after a write under generation 2, the same key under generation 1
  is refused.

A claim the connector does not declare is reported as not checked, never as passed. The kit
writes to the endpoint: point it at a test tenant.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agentledger.connectors import base


@dataclass(frozen=True)
class Sample:
    """A call the endpoint should apply (the kit gives it fresh operation ids)."""

    action: str
    target: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    expected_revision: str | None = None


@dataclass(frozen=True)
class Finding:
    """One claim: ``holds`` True, False, or None when it was not checked (and why)."""

    claim: str
    holds: bool | None
    detail: str


@dataclass(frozen=True)
class Endpoint:
    """What the kit needs: the connector (made for the endpoint), a tenant it may write in,
    its tokens, a sample call and, to check If-Match, a stale revision of the sample's target."""

    connector: base.Connector
    tenant_id: uuid.UUID
    write_token: str
    lookup_token: str
    sample: Sample
    stale_revision: str | None = None


def _call(endpoint: Endpoint, sample: Sample, *, generation: int | None = 1,
          operation_id: uuid.UUID | None = None) -> base.Call:
    return base.Call(endpoint.tenant_id, operation_id or uuid.uuid4(), sample.action,
                     sample.target, dict(sample.arguments), sample.expected_revision,
                     fencing_generation=generation)


async def check(endpoint: Endpoint) -> list[Finding]:
    """Every claim of the connector's contract, checked against the endpoint."""
    c, contract = endpoint.connector, endpoint.connector.contract
    found: list[Finding] = []
    call = _call(endpoint, endpoint.sample)
    first = await c.execute(call, endpoint.write_token)
    applied = isinstance(first, base.Applied)
    found.append(Finding("applies", applied, f"the sample call answered {first!r}"))
    receipt = first.receipt if isinstance(first, base.Applied) else None
    skipped = "the sample call was not applied, so this could not be checked"

    if contract.idempotency == "keyed":
        if receipt is None:
            found.append(Finding("dedupes", None, skipped))
        else:
            again = await c.execute(call, endpoint.write_token)
            same = isinstance(again, base.Applied) and again.receipt == receipt
            found.append(Finding("dedupes", same, (
                "the resend under the same key answered the same receipt" if same else
                f"the resend under the same key answered {again!r}, not the receipt "
                f"{receipt!r}: the endpoint does not deduplicate, a resend after a lost "
                "answer would be a second effect")))
    else:
        found.append(Finding("dedupes", None, f"contract {contract.idempotency!r}: no key "
                                              "to dedupe by; never resent"))

    if contract.lookup:
        if receipt is None:
            found.append(Finding("lookup_finds", None, skipped))
        else:
            seen = await c.lookup(replace(call, fencing_generation=None),
                                  endpoint.lookup_token)
            ok = isinstance(seen, base.Applied) and seen.receipt == receipt
            found.append(Finding("lookup_finds", ok, (
                "the lookup found the applied call with its receipt" if ok else
                f"the lookup answered {seen!r} for an applied call (receipt {receipt!r}): a "
                "lost answer would stay unknown, or be resent")))
        never = await c.lookup(_call(endpoint, endpoint.sample, generation=None),
                               endpoint.lookup_token)
        ok = isinstance(never, base.NotFound)
        found.append(Finding("lookup_not_found", ok, (
            "a key never sent was not found" if ok else
            f"a key never sent answered {never!r}: a lookup that finds what never happened "
            "invents successes")))
    else:
        for claim in ("lookup_finds", "lookup_not_found"):
            found.append(Finding(claim, None, "the contract declares no lookup"))

    if endpoint.stale_revision is None:
        found.append(Finding("if_match", None, "no stale revision given (--stale-revision)"))
    else:
        stale = _call(endpoint, replace(endpoint.sample,
                                        expected_revision=endpoint.stale_revision))
        refused = await c.execute(stale, endpoint.write_token)
        ok = isinstance(refused, base.PreconditionFailed)
        detail = ("a stale revision was refused as a failed precondition" if ok else
                  f"a stale revision answered {refused!r}: an approved change would be "
                  "applied to a record that changed since")
        if ok and contract.lookup:
            after = await c.lookup(replace(stale, fencing_generation=None),
                                   endpoint.lookup_token)
            if not isinstance(after, base.NotFound):
                ok, detail = False, f"refused, yet the lookup answered {after!r}"
        found.append(Finding("if_match", ok, detail))

    if contract.fencing:
        op = uuid.uuid4()
        newer = await c.execute(_call(endpoint, endpoint.sample, generation=2, operation_id=op),
                                endpoint.write_token)
        if not isinstance(newer, base.Applied):
            found.append(Finding("fencing", None, f"the generation-2 write answered {newer!r}"))
        else:
            older = await c.execute(
                _call(endpoint, endpoint.sample, generation=1, operation_id=op),
                endpoint.write_token)
            ok = isinstance(older, base.Fenced)
            found.append(Finding("fencing", ok, (
                "a lower generation for the same key was refused" if ok else
                f"a lower generation for the same key answered {older!r}: a stale worker "
                "could still write")))
    else:
        found.append(Finding("fencing", None, "the contract declares no fencing"))
    return found


def failed(findings: list[Finding]) -> list[Finding]:
    """The claims the endpoint does not keep."""
    return [f for f in findings if f.holds is False]
