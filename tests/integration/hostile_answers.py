"""What a hostile provider does, generated: the plans of the hostile-provider suite.

A :class:`Plan` is what one provider does for one command: its answers to the command's
writes (HTTP) or SMTP conversations, to its lookups and to its fences, in the order they
arrive (the last one repeats). Each answer says what the provider *did* (``applies``, or
for SMTP ``accept``) besides what it *says*, and is generated truthfully wherever a client
could not tell a lie from the truth (a lie no client can detect is a provider's bug, not
ours — the suite's docstring lists them):

- a write answered 2xx with a whole answer (200, 201, 204, …; 202 aside) applied it — a 2xx
  is the provider's word that it did; an answer never received whole (dropped, late, cut
  short, not HTTP) may or may not have applied;
- a write answered a definitive refusal (a 4xx other than 408, 409, 425 and 429, or a 408 /
  409 naming the documented ``deadline_passed`` / ``stale_fencing_token``: "nothing
  applied"; a 409 to a request without an idempotency key, a refund's: RFC 9110's "could
  not be completed", as the billing connector reads it) applied nothing. Once an earlier request applied the key, such an answer is a
  lie the suite records (``Live.lied``) and exempts from "applied → never failed";
- an SMTP server that replied 2xx after the data accepted the message, and one that replied
  4xx or 5xx there did not; a dropped, late or garbled reply may hide either;
- a lookup says "found" (a record of this key, applied) only for an applied key and "not
  found" (404, or a search without this message) only for one never applied; everything
  else it may answer (redirects, 5xx, bodies that are not JSON objects, records of other
  keys, wrong field types, late, dropped) is no answer at all, whatever the key's state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from hypothesis import strategies as st

from agentledger.connectors import hostile

# The bound the suite gives each client's read (and an SMTP step; a whole call: twice it),
# and how long a late answer waits: past every one, so the client has given up. Short,
# because every late answer costs the run a bound.
SHORT_S = 0.3
LATE_S = 2 * SHORT_S + 0.2

Location = Literal["loopback", "second", "relative", "garbage"]
# Where a 3xx points: the same stand-in under /followed (a redirect to loopback), the second
# stand-in (another host), a relative path, or no URL at all.
FOLLOWED = "/followed"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``kind`` is its class (counted in the evidence); ``truthful``: built
    when served from what the provider did for the key (a lookup's found / not found, a
    fence that advanced); ``location``: a redirect's target, filled when served;
    ``definitive``: it says nothing was applied."""

    kind: str
    http: hostile.HttpAnswer = field(default_factory=hostile.HttpAnswer)
    truthful: bool = False
    location: Location | None = None
    definitive: bool = False
    receipt: str = '"n-1"'  # a truthful lookup's receipt field, as raw JSON


@dataclass(frozen=True)
class Conversation:
    """One SMTP conversation and its class."""

    kind: str
    smtp: hostile.SmtpAnswer


@dataclass(frozen=True)
class Plan:
    """What the provider does for one command, request by request (the last repeats)."""

    connector: str
    writes: tuple[Answer, ...] = ()
    lookups: tuple[Answer, ...] = ()
    fences: tuple[Answer, ...] = ()
    conversations: tuple[Conversation, ...] = ()


# ---- values: what a receipt field can hold ----------------------------------------------

_HUGE = "r" * 200_000
# JSON texts of hostile values: NUL, a lone surrogate, bidi and control characters, 200 kB,
# empty, numbers Python refuses (5,000 digits) or turns infinite, NaN, wrong types, nesting.
RAW_VALUES = (
    '""', '" "', json.dumps("\x00"), json.dumps("n-\x00-1"), json.dumps("\ud800"),
    json.dumps("\u202e\u2066evil\x1b[2J\x07"), json.dumps("\x00" + _HUGE), json.dumps(_HUGE),
    "1" * 5000, "1e400", "NaN", "-Infinity", "0", "-1", "3.5", "true", "false", "null", "[]",
    "{}", '{"note_id": {"note_id": [null]}}', '["n-1"]', json.dumps("\ufffd\ufffd"),
)
values = st.one_of(
    st.sampled_from(RAW_VALUES),
    st.text(max_size=40).map(json.dumps),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


@st.composite
def receipt_body(draw: st.DrawFn, *, target: str = "c-1") -> bytes:
    """A JSON object whose receipt fields hold hostile values (sometimes repeated keys)."""
    fields = draw(st.lists(st.sampled_from(
        ["note_id", "refund_id", "id", "revision", "customer_id", "status", "response"]),
        min_size=0, max_size=4))
    parts = [f'"{name}": {draw(values)}' for name in fields]
    if draw(st.booleans()):
        parts.append(f'"customer_id": {json.dumps(target)}')
    return ("{" + ", ".join(parts) + "}").encode()


# Bodies that are not a JSON object (or not one a client can read whole).
BROKEN_BODIES = (
    b"\xff\xfe{\x00", b"[1, 2]", b"null", b'"n-1"', b"42", b"true", b"", b'{"note_id": "n',
    "{\"note_id\": \"\u00e9\"}".encode("latin-1"), '{"note_id": "n-1"}'.encode("utf-16"),
    b"[" * 60_000 + b"]" * 60_000, b"{" + b" " * (1 << 20) + b"}",
)

# ---- HTTP answers ----------------------------------------------------------------------

DEFINITIVE_4XX = (400, 401, 403, 404, 405, 410, 412, 413, 415, 422, 428, 451, 499)
AMBIGUOUS_4XX = (408, 409, 425, 429)
ERROR_BODIES = (b'{"error": {"code": "in_progress"}}', b"", b"\xff\xfe", b"[]",
                b'{"error": "stale"}', b'{"error": {"code": 409}}')
# Framing a client cannot read as one whole answer.
RAW = (
    b"\xff\xfe SMTP\r\n\r\n",
    b"HTTP/1.1 201\r\n",
    b"HTTP/1.1 2O1 Created\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"not",
    b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}",
    b"HTTP/1.1 201 Created\r\nX-Huge: " + b"h" * 20_000 + b"\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 30\r\n\r\n{}",
    b"\r\n\r\n",
)


def _head(status: int, body: bytes, *, applies: bool, **more: object) -> hostile.HttpAnswer:
    return hostile.HttpAnswer(status, body, applies=applies, **more)  # type: ignore[arg-type]


def _weighted(kinds: dict[str, int], slow: frozenset[str], fast: bool) -> list[str]:
    return [k for k, n in kinds.items() if not (fast and k in slow) for _ in range(n)]


# Answer classes and their weights: an answer held past the bound (``late``; a 1xx, after
# which a client waits for the final answer) costs the run its bound, so it is rarer, and
# never the answer that repeats (``fast``).
_WRITES = {"2xx receipt": 8, "2xx body not an object": 3, "2xx cut short": 2, "202": 1,
           "1xx": 1, "3xx": 5, "4xx refusal": 4, "4xx ambiguous": 3,
           "4xx nothing-applied code": 2, "5xx": 3, "unreadable framing": 3, "dropped": 4,
           "late": 1}
_SLOW = frozenset({"1xx", "late"})


@st.composite
def write_answers(draw: st.DrawFn, *, keyed: bool = True, fast: bool = False) -> Answer:
    """One answer to a write (crm, billing, the declared API), truthful as the module says;
    ``keyed``: the request carries an idempotency key."""
    maybe = draw(st.booleans())  # what the provider did, where the answer does not say
    kind = draw(st.sampled_from(_weighted(_WRITES, _SLOW, fast)))
    if kind == "2xx receipt":
        status = draw(st.sampled_from([200, 201, 201, 204, 299]))
        return Answer(kind, _head(status, draw(receipt_body()), applies=True, headers=(
            ("Content-Type", "application/json"),
            ("Idempotent-Replayed", draw(st.sampled_from(["true", "false", "\x7f"]))))))
    if kind == "2xx body not an object":
        return Answer(kind, _head(draw(st.sampled_from([200, 201])),
                                  draw(st.sampled_from(BROKEN_BODIES)), applies=True))
    if kind == "2xx cut short":  # a length that lies either way
        body = draw(receipt_body())
        longer = draw(st.booleans())
        length = len(body) + 4096 if longer else max(len(body) // 2, 1)
        # Shorter: a whole answer as framed (its length's worth), so a 2xx that applied.
        return Answer(kind, _head(201, body, applies=maybe or not longer,
                                  content_length=length))
    if kind == "202":
        return Answer(kind, _head(202, draw(receipt_body()), applies=maybe))
    if kind == "1xx":
        return Answer(kind, _head(draw(st.sampled_from([100, 101, 102, 103, 199])),
                                  draw(st.sampled_from([b"", b"{}"])), applies=maybe))
    if kind == "3xx":
        status = draw(st.sampled_from([300, 301, 302, 303, 304, 307, 308, 399]))
        where = draw(st.sampled_from(["loopback", "second", "second", "relative", "garbage"]))
        return Answer(f"3xx to {where}", _head(status, draw(receipt_body()), applies=maybe),
                      location=where)  # type: ignore[arg-type]
    if kind == "4xx refusal":
        return Answer(kind, _head(draw(st.sampled_from(DEFINITIVE_4XX)),
                                  draw(st.sampled_from(ERROR_BODIES)), applies=False),
                      definitive=True)
    if kind == "4xx ambiguous":
        status = draw(st.sampled_from(AMBIGUOUS_4XX))
        # A 409 says "a request with this key is still in progress" only to a request that
        # carries one (the IETF Idempotency-Key draft); to one without, it is RFC 9110's
        # "could not be completed": a refusal (the billing connector's documented reading).
        refusal = status == 409 and not keyed
        return Answer("4xx refusal" if refusal else kind, _head(
            status, draw(st.sampled_from(ERROR_BODIES)), applies=maybe and not refusal),
            definitive=refusal)
    if kind == "4xx nothing-applied code":
        status, code = draw(st.sampled_from([(409, "stale_fencing_token"),
                                             (408, "deadline_passed")]))
        body = json.dumps({"error": {"code": code}}).encode()
        return Answer(kind, _head(status, body, applies=False), definitive=True)
    if kind == "5xx":
        return Answer(kind, _head(draw(st.sampled_from([500, 502, 503, 504, 599, 600, 999])),
                                  draw(st.sampled_from((*ERROR_BODIES, b'{"note_id": "n-1"}'))),
                                  applies=maybe))
    if kind == "unreadable framing":
        return Answer(kind, hostile.HttpAnswer(raw=draw(st.sampled_from(RAW)), applies=maybe))
    if kind == "dropped":
        return Answer(f"dropped {'after' if maybe else 'before'} applying",
                      hostile.HttpAnswer(drop=True, applies=maybe))
    return Answer(kind, _head(201, draw(receipt_body()), applies=maybe, delay_s=LATE_S))


_GARBAGE = {"3xx": 3, "5xx": 2, "other status": 2, "200 not an object": 3, "200 another key": 2,
            "200 wrong field types": 4, "200 cut short": 1, "unreadable framing": 2,
            "dropped": 2, "late": 1}


@st.composite
def garbage(draw: st.DrawFn, *, fast: bool = False) -> Answer:
    """An answer to a lookup or a fence that is no answer, whatever the key's state."""
    kind = draw(st.sampled_from(_weighted(_GARBAGE, _SLOW, fast)))
    if kind == "3xx":
        where = draw(st.sampled_from(["loopback", "second", "relative"]))
        return Answer(f"3xx to {where}", hostile.HttpAnswer(
            draw(st.sampled_from([301, 302, 303, 307, 308])), b""), location=where)  # type: ignore[arg-type]
    if kind == "5xx":
        return Answer(kind, hostile.HttpAnswer(draw(st.sampled_from([500, 503, 504])), b"{}"))
    if kind == "other status":
        status = draw(st.sampled_from([101, 201, 202, 204, 401, 403, 410, 429, 999]))
        return Answer(kind, hostile.HttpAnswer(status, b'{"status": 201}'))
    if kind == "200 not an object":
        return Answer(kind, hostile.HttpAnswer(200, draw(st.sampled_from(BROKEN_BODIES))))
    if kind == "200 another key":
        other = {"idempotency_key": "00000000-0000-4000-8000-000000000000", "status": 201,
                 "fencing_key": "someone-else", "token": 99,
                 "response": {"note_id": "n-9", "customer_id": "c-9"},
                 "messages": [{"MessageID": "someone-else@agentledger",
                               "From": {"Address": "mallory@evil.test"},
                               "To": [{"Address": "eve@evil.test"}]}]}
        return Answer(kind, hostile.HttpAnswer(200, json.dumps(other).encode()))
    if kind == "200 wrong field types":
        # Filled with this key when served: {key} stands for it.
        body = draw(st.sampled_from([
            '{"idempotency_key": "{key}", "status": "201", "response": {}}',
            '{"idempotency_key": ["{key}"], "status": 201}',
            '{"idempotency_key": "{key}", "status": 201.0}',
            '{"idempotency_key": "{key}", "status": true}',
            '{"idempotency_key": "{key}", "status": 500, "response": {"note_id": "n"}}',
            '{"fencing_key": "{key}", "token": "7"}', '{"fencing_key": "{key}", "token": 0}',
            '{"fencing_key": "{key}"}', '{"messages": null}', '{"messages": "{key}"}',
            '{"messages": [1, null, "{key}"]}',
            '{"messages": [{"MessageID": ["{key}"], "From": "agent", "To": {"a": 1}}]}']))
        return Answer(kind, hostile.HttpAnswer(200, body.encode()))
    if kind == "200 cut short":
        return Answer(kind, hostile.HttpAnswer(200, b'{"status": 201', content_length=4096))
    if kind == "unreadable framing":
        return Answer(kind, hostile.HttpAnswer(raw=draw(st.sampled_from(RAW))))
    if kind == "dropped":
        return Answer(kind, hostile.HttpAnswer(drop=True))
    return Answer(kind, hostile.HttpAnswer(200, b"{}", delay_s=LATE_S))


@st.composite
def truthful(draw: st.DrawFn) -> Answer:
    """The provider's true answer for the key, its receipt field hostile now and then."""
    if draw(st.integers(0, 2)) == 0:
        return Answer("truthful, hostile receipt", truthful=True, receipt=draw(values))
    return Answer("truthful", truthful=True)


def answers_then(first: Callable[..., st.SearchStrategy[Answer]],
                 recovered: st.SearchStrategy[Answer], in_ten: int
                 ) -> st.SearchStrategy[tuple[Answer, ...]]:
    """Up to three answers of ``first``, then the one that repeats: ``recovered`` (a
    provider back to health) ``in_ten`` times in ten, else a fast one of ``first`` (one
    that never recovers: the generation cap's case)."""
    tail = st.integers(0, 9).flatmap(lambda n: recovered if n < in_ten else first(fast=True))
    return st.tuples(st.lists(first(), max_size=3), tail).map(lambda t: (*t[0], t[1]))


@st.composite
def healthy_write(draw: st.DrawFn) -> Answer:
    """A provider back to health: 201 and its receipt, applied."""
    note = draw(st.integers(1, 10**6))
    body = json.dumps({"note_id": f"n-{note}", "refund_id": f"r-{note}"}).encode()
    return Answer("2xx receipt", hostile.HttpAnswer(201, body, applies=True))


# ---- SMTP --------------------------------------------------------------------------------

STEPS = ("greeting", "EHLO", "MAIL", "RCPT", "DATA", "END")
# The replies a client goes on after, per step.
_EXPECTED = {"greeting": (220,), "EHLO": (220, 250, 251, 252), "MAIL": (220, 250, 251, 252),
             "RCPT": (220, 250, 251, 252), "DATA": (354,), "END": (250,)}
CODES = (220, 250, 251, 252, 354, 199, 300, 421, 450, 451, 452, 500, 501, 502, 503, 530, 550,
         552, 554, 999)


@st.composite
def conversations(draw: st.DrawFn, *, fast: bool = False) -> Conversation:
    """One SMTP conversation: all goes well up to one step, where the server replies an odd
    or refusing code, drops the connection, garbles its reply or holds it past the bound;
    the steps around the data (where a message may be kept) more often than the others."""
    fault = draw(st.sampled_from(["none"] * 2 + ["code"] * 4 + ["drop"] * 2 + ["garbage"] * 2
                                 + ([] if fast else ["late"] * 2)))
    at = draw(st.sampled_from((*STEPS, "DATA", "END", "END")))
    codes = {}
    if fault == "code":
        codes = {at: draw(st.sampled_from([c for c in CODES if c not in _EXPECTED[at]]))}
    end = codes.get("END", 250)
    hidden = fault in ("drop", "garbage", "late") and at == "END"
    # What the server did with the data where its reply does not say (hidden, or a code that
    # means nothing there); a 2xx there says it kept the message, a 4xx or 5xx that it did not.
    says = 200 <= end < 300 or 400 <= end < 600
    accept = draw(st.booleans()) if hidden or not says else 200 <= end < 300
    smtp = hostile.SmtpAnswer(
        codes=codes, accept=accept, drop_at=at if fault == "drop" else None,
        garbage_at=at if fault == "garbage" else None, delay_at=at if fault == "late" else None,
        delay_s=LATE_S if fault == "late" else 0.0)
    if fault == "none":
        return Conversation("accepted", smtp)
    return Conversation(f"{codes[at] if fault == 'code' else fault} at {at}", smtp)


# ---- plans -----------------------------------------------------------------------------

ACCEPTED = Conversation("accepted", hostile.SmtpAnswer())


def plans(connector: str) -> st.SearchStrategy[Plan]:
    """What the provider of ``connector`` (crm, billing, email, crmhttp) does for a command."""
    fences = answers_then(garbage, st.just(Answer("truthful", truthful=True)), 7)
    lookups = answers_then(garbage, truthful(), 8) if connector != "billing" else st.just(())
    if connector == "email":
        talks = st.tuples(st.lists(conversations(), min_size=1, max_size=3),
                          st.sampled_from([ACCEPTED] * 7 + [None] * 3)).flatmap(
            lambda t: st.just((*t[0], t[1])) if t[1] is not None else
            conversations(fast=True).map(lambda last: (*t[0], last)))
        return st.builds(Plan, st.just(connector), conversations=talks, lookups=lookups)
    return st.builds(Plan, st.just(connector),
                     writes=answers_then(partial(write_answers, keyed=connector != "billing"),
                                         healthy_write(), 7),
                     lookups=lookups, fences=fences)
