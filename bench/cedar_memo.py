"""The Cedar memo on the real policy set: a decision cold, a hit, the key's cost, an entry's size.

    . .local/env && .venv/bin/python -m bench.cedar_memo [--rounds 5 --n 2000]

No stack needed (pure CPU, one process). CPU time of this thread (``time.thread_time``) per
call, the median of ``--rounds`` rounds of ``--n`` calls each, in µs:

- ``cold``: a decision with the memo off (every call put to Cedar: what main pays), and
  ``miss``: with the memo on and every key new (what a workload with no repetition pays);
- ``hit``: the same question again;
- ``key``: what a hit costs before the memo's lookup — the entities and context built and
  dumped to the JSON texts the key holds, and their hash (the lookup replaced by a hash);
- the same for ``may_approve`` (the approval question with a requester in the entities).

Shapes: the e2e bench's (one principal, ``crm.note.create`` on one customer; admission passes
the note's arguments, the executor's re-check none) and a refund with an amount. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from agentledger.policy import allowlist, cedar

TENANT = uuid.UUID("00000000-0000-4000-8000-000000000001")


def per_call_us(fn: Callable[[int], object], n: int, rounds: int) -> dict[str, float]:
    """Median and spread of ``rounds`` rounds of ``n`` calls ``fn(i)``, CPU µs per call."""
    fn(0)
    samples = []
    for r in range(rounds):
        start = time.thread_time()
        for i in range(n):
            fn(r * n + i)
        samples.append((time.thread_time() - start) / n * 1e6)
    return {"median": round(statistics.median(samples), 2),
            "min": round(min(samples), 2), "max": round(max(samples), 2)}


def entry_bytes(policy_size: int) -> float:
    """Python heap per memo entry (key strings, answers, the cache's link), filling it."""
    policy = cedar.CedarPolicy(memo_size=policy_size)
    note = allowlist.Allowlist.load().get("crm.note.create")
    alice = cedar.Principal(TENANT, "user:alice", frozenset({"user", "agent-operator"}))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(policy_size):
        policy.evaluate(cedar.PolicyRequest(alice, note, f"cust-{uuid.UUID(int=i)}",
                                            {"customer_id": "c", "body": "b"}))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert policy.memo_stats().entries == policy_size
    return round((after - before) / policy_size, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n, rounds = args.n, args.rounds
    rules = allowlist.Allowlist.load()
    note, refund = rules.get("crm.note.create"), rules.get("billing.refund.create")
    alice = cedar.Principal(TENANT, "user:alice", frozenset({"user", "agent-operator"}))
    bob = cedar.Principal(TENANT, "user:bob", frozenset({"approver"}))
    customer = str(uuid.UUID(int=42))
    admission = cedar.PolicyRequest(alice, note, customer,
                                    {"customer_id": customer, "body": "bench note"})
    redispatch = cedar.PolicyRequest(alice, note, customer)
    approval = cedar.PolicyRequest(alice, refund, customer,
                                   {"amount_minor": 1200, "currency": "EUR"})

    off = cedar.CedarPolicy(memo_size=0)
    on = cedar.CedarPolicy(memo_size=4096)
    fresh = cedar.CedarPolicy(memo_size=4096)
    out: dict[str, Any] = {"n": n, "rounds": rounds, "load_avg_before": os.getloadavg()}

    def new(request: cedar.PolicyRequest, i: int) -> cedar.PolicyRequest:
        return cedar.PolicyRequest(request.principal, request.action, f"{customer}-{i}",
                                   request.arguments)

    # A hit's path up to the memo's lookup: the lookup replaced by the key's hash.
    keyed = cedar.CedarPolicy(memo_size=0)
    answers = on._ask(["perform", "perform_unattended"], alice, customer, TENANT,
                      {"operation": {"name": note.name}}, [])

    def key_only(*key: Any) -> Any:
        hash(key)
        return answers[:len(key[0])]

    keyed._memo = key_only  # type: ignore[assignment]
    for name, request in (("note_admission", admission), ("note_recheck", redispatch)):
        out[name] = {
            "cold": per_call_us(lambda _i, r=request: off.evaluate(r), n, rounds),
            "miss": per_call_us(lambda i, r=request: fresh.evaluate(new(r, i)), n, rounds),
            "new_request_only": per_call_us(lambda i, r=request: new(r, i), n, rounds),
            "hit": per_call_us(lambda _i, r=request: on.evaluate(r), n, rounds),
            "key": per_call_us(lambda _i, r=request: keyed.evaluate(r), n, rounds),
        }
    out["approval"] = {
        "cold": per_call_us(lambda _i: off.may_approve(bob, approval), n, rounds),
        "hit": per_call_us(lambda _i: on.may_approve(bob, approval), n, rounds),
        "key": per_call_us(lambda _i: keyed.may_approve(bob, approval), n, rounds),
    }
    out["memo_stats"] = {"on": on.memo_stats()._asdict(), "fresh": fresh.memo_stats()._asdict()}
    out["entry_bytes"] = entry_bytes(4096)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
