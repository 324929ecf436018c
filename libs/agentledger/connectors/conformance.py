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
- ``fencing`` — ``fencing``: after the fence of a fresh key is advanced to generation 2
  (``fence``, no write), a call under generation 1 is refused (and, with lookup, nothing was
  applied): what a take-over or an operator's resolution relies on (issue 37);
- ``lookup`` — ``lookup_ignores_lookalike``: a lookup does not take a look-alike for this
  operation's effect: the sample applied under another key (and whatever ``lookalikes``
  plants, e.g. a message with this operation's id from another sender) is not found;
- ``answers`` (with ``retarget``): a copy of the connector pointed at hostile stand-ins
  (:mod:`agentledger.connectors.hostile`) gets redirects, bodies that are not UTF-8 or not
  JSON objects, lying lengths, megabyte NUL-bearing receipts, dropped connections and late
  answers: through the SDK's boundary every one is classified — never a success the stand-in
  did not apply, never an applied effect called not done, every receipt storable, no
  redirect followed (R14).

A claim the connector does not declare is reported as not checked, never as passed. The kit
writes to the endpoint: point it at a test tenant.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pydantic

from agentledger.connectors import base, boundary, hostile
from agentledger.contracts import outcomes


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
class Targets:
    """Where a re-pointed copy of the connector sends: a hostile HTTP stand-in (every option
    that is an http(s) URL) and a hostile SMTP stand-in (``smtp_host``, ``smtp_port``)."""

    http_url: str
    smtp_host: str
    smtp_port: int


# Plants, in the endpoint, an effect that resembles the given call's but is not it (another
# sender, another deployment's id, another recipient).
Planter = Callable[[base.Call], Awaitable[None]]


@dataclass(frozen=True)
class Endpoint:
    """What the kit needs: the connector (made for the endpoint), a tenant it may write in,
    its tokens, a sample call and, to check If-Match, a stale revision of the sample's target.

    ``retarget`` makes a copy of the connector for other :class:`Targets` (the ``answers``
    claim; ``agentledger connector test`` derives it from the connector's options);
    ``lookalikes`` plant endpoint-specific look-alike effects (``lookup_ignores_lookalike``).
    """

    connector: base.Connector
    tenant_id: uuid.UUID
    write_token: str
    lookup_token: str
    sample: Sample
    stale_revision: str | None = None
    retarget: Callable[[Targets], base.Connector] | None = None
    lookalikes: Sequence[Planter] = ()


def _call(endpoint: Endpoint, sample: Sample, *, generation: int | None = 1,
          operation_id: uuid.UUID | None = None) -> base.Call:
    return base.Call(endpoint.tenant_id, operation_id or uuid.uuid4(), sample.action,
                     sample.target, dict(sample.arguments), sample.expected_revision,
                     fencing_generation=generation)


class _Through:
    """The connector as the executor and the reconciler call it: through the boundary."""

    def __init__(self, connector: base.Connector) -> None:
        self.connector, self.contract = connector, connector.contract
        self.bound = connector.contract.call_timeout_s

    async def execute(self, call: base.Call, token: str) -> base.Result:
        return await boundary.execute(self.connector, call, token, bound_s=self.bound)

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return await boundary.lookup(self.connector, call, token, bound_s=self.bound)

    async def fence(self, call: base.Call, token: str) -> base.FenceResult:
        return await boundary.fence(self.connector, call, token, bound_s=self.bound)


async def check(endpoint: Endpoint) -> list[Finding]:
    """Every claim of the connector's contract, checked against the endpoint."""
    c, contract = _Through(endpoint.connector), endpoint.connector.contract
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

    found.append(await _fencing(endpoint, c))
    found.append(await _lookalike(endpoint, c, applied=receipt is not None))
    found.append(await _answers(endpoint))
    return found


async def _fencing(endpoint: Endpoint, c: _Through) -> Finding:
    if not c.contract.fencing:
        return Finding("fencing", None, "the contract declares no fencing")
    op = uuid.uuid4()
    advanced = await c.fence(_call(endpoint, endpoint.sample, generation=2, operation_id=op),
                             endpoint.lookup_token)
    if not isinstance(advanced, base.Advanced):
        return Finding("fencing", False, f"advancing the fence of a fresh key to generation 2 "
                       f"answered {advanced!r}: a take-over could not fence a stalled worker "
                       "out before deciding without it")
    stale = await c.execute(_call(endpoint, endpoint.sample, generation=1, operation_id=op),
                            endpoint.write_token)
    if not isinstance(stale, base.Fenced):
        return Finding("fencing", False, f"after the fence was advanced to generation 2, a call "
                       f"under generation 1 answered {stale!r}: a stalled worker's late call "
                       "could still write")
    if c.contract.lookup:
        after = await c.lookup(_call(endpoint, endpoint.sample, generation=None,
                                     operation_id=op), endpoint.lookup_token)
        if not isinstance(after, base.NotFound):
            return Finding("fencing", False, f"the refused stale call left {after!r} behind")
    return Finding("fencing", True, "advanced to generation 2 without a write, a call under "
                   "generation 1 was refused and applied nothing")


async def _lookalike(endpoint: Endpoint, c: _Through, *, applied: bool) -> Finding:
    if not c.contract.lookup:
        return Finding("lookup_ignores_lookalike", None, "the contract declares no lookup")
    if not applied:
        return Finding("lookup_ignores_lookalike", None, "the sample call was not applied, "
                       "so there is nothing to look alike")
    # The sample's effect exists under another key (the first call); this key's never did.
    tried = ["the sample's effect under another key"]
    fresh = _call(endpoint, endpoint.sample, generation=None)
    seen = await c.lookup(fresh, endpoint.lookup_token)
    if isinstance(seen, base.Applied):
        return Finding("lookup_ignores_lookalike", False, f"a key never sent was 'found' "
                       f"({seen!r}) while the same call exists under another key: a look-alike "
                       "turns a lost answer into an invented success")
    for plant in endpoint.lookalikes:
        fresh = _call(endpoint, endpoint.sample, generation=None)
        await plant(fresh)
        tried.append(getattr(plant, "__name__", "a planted look-alike"))
        seen = await c.lookup(fresh, endpoint.lookup_token)
        if isinstance(seen, base.Applied):
            return Finding("lookup_ignores_lookalike", False, f"{tried[-1]} was 'found' "
                           f"({seen!r}): the lookup does not check what identifies the effect")
    return Finding("lookup_ignores_lookalike", True, "not found: " + "; ".join(tried))


# ---- answers: a copy of the connector against hostile stand-ins --------------------------

# The call bound the kit gives the boundary for a hostile answer: short, so an answer held
# past it (3 s) is in doubt without the kit waiting a whole declared bound.
HOSTILE_BOUND_S = 1.0
HOSTILE_DELAY_S = 3.0


@dataclass(frozen=True)
class Hostile:
    """One hostile behaviour: what the HTTP stand-in answers a write (or a lookup), and what
    the SMTP stand-in does; ``redirect``: answered with a redirect to a second stand-in."""

    name: str
    write: hostile.HttpAnswer | None = None
    lookup: hostile.HttpAnswer | None = None
    smtp: hostile.SmtpAnswer | None = None
    redirect: int | None = None
    keyed_only: bool = False


_BIG = "\u0000" + "r" * 200_000
_APPLIED = hostile.HttpAnswer(201, json.dumps({"note_id": "n-1", "refund_id": "r-1",
                                                "id": "x-1"}).encode(), applies=True)
BATTERY: tuple[Hostile, ...] = (
    Hostile("a 302 after the write", redirect=302),
    Hostile("a 307 replaying the write elsewhere", redirect=307),
    Hostile("201 with a body that is not UTF-8",
            write=hostile.HttpAnswer(201, b"\xff\xfe{\x00", applies=True)),
    Hostile("201 with a JSON array", write=hostile.HttpAnswer(201, b"[1, 2]", applies=True)),
    Hostile("201 with null", write=hostile.HttpAnswer(201, b"null", applies=True)),
    Hostile("201 with a 200 kB NUL-bearing receipt", write=hostile.HttpAnswer(
        201, json.dumps({"note_id": _BIG, "refund_id": _BIG, "id": _BIG}).encode(),
        applies=True)),
    Hostile("201 with a body shorter than its length", write=hostile.HttpAnswer(
        201, b'{"note_id": "n', content_length=4096, applies=True)),
    Hostile("200 with no body", write=hostile.HttpAnswer(200, b"", applies=True)),
    Hostile("the connection dropped after the write",
            write=hostile.HttpAnswer(drop=True, applies=True)),
    Hostile("the connection dropped before the write", write=hostile.HttpAnswer(drop=True)),
    Hostile("an answer after the call bound", write=replace(_APPLIED, delay_s=HOSTILE_DELAY_S)),
    Hostile("an answer that is not HTTP", write=hostile.HttpAnswer(raw=b"\xff\xfe SMTP\r\n\r\n")),
    Hostile("409: a request with this key is still in progress", keyed_only=True,
            write=hostile.HttpAnswer(409, b'{"error": {"code": "in_progress"}}', applies=True)),
    Hostile("a lookup answering 200 with a body that is not UTF-8",
            lookup=hostile.HttpAnswer(200, b"\xff\xfe")),
    Hostile("a lookup answering a JSON array", lookup=hostile.HttpAnswer(200, b"[]")),
    Hostile("a lookup answering a record of another key", lookup=hostile.HttpAnswer(
        200, json.dumps({"idempotency_key": "someone-else", "status": 201,
                         "response": {"note_id": "n-9", "customer_id": "c-9"},
                         "messages": [{"MessageID": "someone-else@agentledger",
                                       "From": {"Address": "mallory@evil.test"},
                                       "To": [{"Address": "eve@evil.test"}]}]}).encode())),
    Hostile("a lookup answered after the call bound", lookup=hostile.HttpAnswer(
        200, b"{}", delay_s=HOSTILE_DELAY_S)),
    Hostile("SMTP: the answer to the data dropped after acceptance",
            smtp=hostile.SmtpAnswer(drop_at="END")),
    Hostile("SMTP: the answer to the data after the call bound",
            smtp=hostile.SmtpAnswer(delay_at="END", delay_s=HOSTILE_DELAY_S)),
    Hostile("SMTP: a greeting that is not SMTP",
            smtp=hostile.SmtpAnswer(garbage_at="greeting", accept=False)),
    Hostile("SMTP: 451 at RCPT", smtp=hostile.SmtpAnswer(codes={"RCPT": 451}, accept=False)),
    Hostile("SMTP: 554 after the data", smtp=hostile.SmtpAnswer(codes={"END": 554},
                                                                accept=False)),
)


def _storable(receipt: str) -> bool:
    try:
        outcomes.Succeeded(receipt=receipt)
    except pydantic.ValidationError:
        return False
    return True


def judge(result: base.Result | base.Lookup, *, applied: bool) -> str | None:
    """What is wrong with ``result`` for what the provider actually did (None: nothing)."""
    if isinstance(result, base.Applied):
        if not applied:
            return f"answered {result!r}, but nothing was applied: an invented success"
        if not _storable(result.receipt):
            return "a receipt the ledger cannot store"
        return None
    if applied and isinstance(result, base.Refused | base.PreconditionFailed | base.NotSent
                              | base.Fenced | base.NotFound):
        return f"answered {type(result).__name__}, but the effect was applied: it would be lost"
    return None


async def _answers(endpoint: Endpoint) -> Finding:
    if endpoint.retarget is None:
        return Finding("answers", None, "no way to point a copy of the connector at hostile "
                       "stand-ins (Endpoint.retarget; `connector test` derives it from options)")
    keyed = endpoint.connector.contract.idempotency == "keyed"
    checked = 0
    for item in BATTERY:
        if item.keyed_only and not keyed:
            continue
        wrong = await _one(endpoint, item)
        if wrong is not None:
            return Finding("answers", False, f"{item.name}: {wrong}")
        checked += 1
    return Finding("answers", True, f"{checked} hostile answers classified: no invented "
                   "success, no applied effect called not done, every receipt storable, no "
                   "redirect followed")


async def _one(endpoint: Endpoint, item: Hostile) -> str | None:
    assert endpoint.retarget is not None

    def elsewhere(_request: hostile.Request) -> hostile.HttpAnswer:
        return hostile.HttpAnswer(200, b'{"status": 201, "messages": []}', applies=True)

    async with hostile.http(elsewhere) as second:
        def answer(request: hostile.Request) -> hostile.HttpAnswer:
            if item.redirect is not None:
                return hostile.HttpAnswer(item.redirect, b"", headers=(
                    ("Location", second.url + request.path),))
            if request.method == "GET":
                return item.lookup or hostile.HttpAnswer(404, b'{"error": {}}')
            return item.write or _APPLIED

        async with hostile.http(answer) as first, hostile.smtp(
                lambda: item.smtp or hostile.SmtpAnswer()) as mail:
            copy = endpoint.retarget(Targets(first.url, mail.host, mail.port))
            try:
                call = _call(endpoint, endpoint.sample)
                wrote = await boundary.execute(copy, call, endpoint.write_token,
                                               bound_s=HOSTILE_BOUND_S)
                applied = bool(first.applied or mail.messages)
                if wrong := judge(wrote, applied=applied):
                    return wrong
                if copy.contract.lookup:
                    # Whatever the stand-in says, nothing was applied under this fresh key.
                    seen = await boundary.lookup(
                        copy, _call(endpoint, endpoint.sample, generation=None),
                        endpoint.lookup_token, bound_s=HOSTILE_BOUND_S)
                    if wrong := judge(seen, applied=False):
                        return f"the lookup {wrong}"
            finally:
                await copy.aclose()
        if second.requests:
            return (f"a redirect was followed: {len(second.requests)} request(s) reached its "
                    "Location")
    return None


def failed(findings: list[Finding]) -> list[Finding]:
    """The claims the endpoint does not keep."""
    return [f for f in findings if f.holds is False]
