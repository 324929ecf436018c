"""Hostile providers against the four connectors the project ships, through the real
admission, executor and reconciler on the real ledger (issue 38 §5, SPEC R14).

For each generated plan (``hostile_answers``: what the provider answers each write, SMTP
step, lookup and fence — statuses 1xx to 9xx, redirects to loopback and to a second host,
bodies that are not UTF-8, not JSON objects, cut short or of megabytes, NUL-bearing and
wrongly typed receipt fields, lying lengths, answers held past the call bound, connections
dropped before or after applying) one command is admitted (a refund approved by finance),
dispatched by the real ``Dispatcher`` and recovered by the real ``Reconciler`` — its lease
forced to expire by writing it, never by sleeping — until it is final or held for an
operator. Then:

- **no false success**: nothing applied at the stand-in → never ``succeeded``;
- **no applied effect lost**: applied → ``succeeded`` or ``unknown``, never a refusal;
- **every text stored**: a receipt or reason the ledger holds, bounded, without NUL, and no
  exception out of the executor or a sweep's item (an unrecordable applied effect);
- **bounded**: final or held within the steps its generation cap allows, its generation at
  most the cap + ``RECOVERY_SLACK``, its calls to the provider at most a generation's worth
  per generation (the cap: ``AGENTLEDGER_HOSTILE_CAP``, half the shipped one in CI);
- **0 stalled sweeps**: every sweep runs beside a healthy command of another tenant pending
  recovery, and recovers it;
- **no redirect followed**: the second host hears nothing, no request reaches a Location;
- **never resent**: a command whose contract is ``none`` (a refund, an e-mail) has at most
  one effect at the provider.

"Held" is what the reconciler does, not what the suite assumes: ``unknown`` and left alone by
a sweep (no lookup, or at the cap). A command is never left ``pending`` or ``dispatching``:
the driver plays every redelivery, requeue backoff and lease expiry until it is not, so one
still there after the steps its cap allows is a loop. The generation's slack is the one
take-over a command claimed at the cap still needs when its claim ends without a recorded
answer (a provider's "stale fencing token"): cap + 1, never more.

What a provider may lie about, undetectably, is not generated or not held against the
ledger (``hostile_answers``' docstring): a 2xx for a write it did not apply (never
generated); a lookup that finds what never happened or misses what did (never generated);
an SMTP 4xx/5xx after accepting the data (never generated); a definitive refusal (4xx other
than 408/409/425/429, a 408/409 naming "nothing applied", a 409 to a refund, which carries no
idempotency key) for a request it applied (never generated) or a key it applied earlier —
generated when a resend meets it, and then exempt from "applied → never refused" only,
counted as ``lying_provider``.

``AGENTLEDGER_HOSTILE_EVIDENCE=1`` writes the figures to docs/evidence/hostile-providers.json;
``AGENTLEDGER_HOSTILE_EXAMPLES`` sets the examples per connector (a longer local run:
``AGENTLEDGER_HOSTILE_EXAMPLES=500 AGENTLEDGER_HOSTILE_CAP=10``, about ten minutes),
``AGENTLEDGER_HOSTILE_SEED`` another seed than the fixed one (no failure database: a run is
reproduced by its seed, a failure by the blob it prints).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings

from agentledger import settings as agentledger_settings
from agentledger.executor import dispatcher as dispatcher_mod
from agentledger.executor import reconciler as reconciler_mod
from agentledger.ledger import dispatch
from tests.integration import hostile_answers, hostile_world
from tests.integration.hostile_world import Example, Verdict, World

EXAMPLES = int(os.environ.get("AGENTLEDGER_HOSTILE_EXAMPLES", "300"))
# The generation cap the executor and the reconciler are given (their ``max_generations``):
# half the shipped one in CI, since a provider that never recovers costs a sweep per
# generation (an e-mail in doubt is looked up until the cap); the same code holds it either
# way, and a long run takes the shipped ``MAX_GENERATIONS``.
CAP = int(os.environ.get("AGENTLEDGER_HOSTILE_CAP", str(dispatch.MAX_GENERATIONS // 2)))
# Fixed, so CI sees the same plans every run; each connector draws its own from it.
SEED = int(os.environ.get("AGENTLEDGER_HOSTILE_SEED", "20261038"))
EVIDENCE = agentledger_settings.REPO_ROOT / "docs" / "evidence" / "hostile-providers.json"
CONNECTORS = ("crm", "billing", "email", "crmhttp")
VIOLATIONS = ("false success", "applied effect recorded as not done",
              "unrecordable applied effect", "unbounded loop", "stalled sweep",
              "past the generation cap", "text not storable", "redirect followed",
              "second effect", "executor raised", "sweep item raised")

# Answer classes every run must have served at least once.
COVERED = (
    "write: 2xx receipt", "write: 2xx body not an object", "write: 2xx cut short", "write: 1xx",
    "write: 3xx to loopback", "write: 3xx to second", "write: 4xx refusal",
    "write: 4xx ambiguous", "write: 4xx nothing-applied code", "write: 5xx",
    "write: unreadable framing", "write: dropped before applying",
    "write: dropped after applying", "write: late", "lookup: truthful",
    "lookup: truthful, hostile receipt", "lookup: 3xx to second", "lookup: 200 another key",
    "lookup: 200 wrong field types", "lookup: 200 not an object", "lookup: late",
    "lookup: dropped", "fence: truthful", "fence: 200 wrong field types", "smtp: accepted",
    "smtp: 5xx at greeting", "smtp: drop at DATA", "smtp: 4xx at END", "smtp: 5xx at END",
    "smtp: drop at END", "smtp: garbage at END", "smtp: late at END")

RESULTS: dict[str, list[Verdict]] = {}
SECONDS: dict[str, float] = {}


class _Instant:
    """``asyncio`` as the dispatcher sees it: its backoff before a reconnect takes no time
    (time passes by writing it, as the leases do; every reconnect is still made)."""

    @staticmethod
    async def sleep(_seconds: float) -> None:
        await asyncio.sleep(0)


@pytest.fixture(scope="module")
def world(database_url: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[asyncio.Runner, World]]:
    with asyncio.Runner() as runner, pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatcher_mod, "asyncio", _Instant)
        w = runner.run(hostile_world.open_world(database_url, tmp_path_factory.mktemp("op"),
                                                cap=CAP))
        try:
            yield runner, w
        finally:
            runner.run(w.close())


def _fuzz(connector: str, runner: asyncio.Runner, w: World) -> None:
    verdicts = RESULTS.setdefault(connector, [])

    @seed(SEED + zlib.crc32(connector.encode()))
    @settings(max_examples=EXAMPLES, database=None, deadline=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(plan=hostile_answers.plans(connector))
    def one(plan: hostile_answers.Plan) -> None:
        verdict = runner.run(Example(w, plan).run())
        verdicts.append(verdict)
        assert not verdict.problems, (verdict.problems, plan)

    started = time.perf_counter()
    one()
    SECONDS[connector] = time.perf_counter() - started
    assert w.provider.unrouted == 0


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("connector", CONNECTORS)
def test_a_hostile_provider_never_breaks_the_ledger(
        connector: str, world: tuple[asyncio.Runner, World]) -> None:
    _fuzz(connector, *world)


def figures() -> dict[str, Any]:
    """The run's totals, for docs/evidence/ and the zeros asserted below."""
    every = [v for verdicts in RESULTS.values() for v in verdicts]
    violations = Counter(kind for v in every for kind, _ in v.problems)
    classes: Counter[str] = Counter()
    for v in every:
        for kind, n in v.served.items():
            classes[_coarse(kind)] += n
    per: dict[str, Any] = {}
    for name, verdicts in RESULTS.items():
        served: Counter[str] = Counter()
        for v in verdicts:
            served.update(v.served)
        per[name] = {
            "examples": len(verdicts), "answers": sum(served.values()),
            "seconds": round(SECONDS.get(name, 0.0), 1),
            "applied_at_provider": sum(v.applied for v in verdicts),
            "lying_provider": sum(v.lied for v in verdicts),
            "sweeps": sum(v.sweeps for v in verdicts),
            "outcomes": dict(sorted(Counter(
                f"{'applied' if v.applied else 'not applied'} → {v.state}"
                for v in verdicts).items())),
            "highest_generation": max((v.generation for v in verdicts), default=0),
            "answer_classes": dict(sorted(served.items())),
        }
    return {
        "suite": "tests/integration/test_hostile_providers.py",
        "seed": SEED, "examples_per_connector": EXAMPLES,
        "examples": len(every), "answers": sum(p["answers"] for p in per.values()),
        "seconds": round(sum(SECONDS.values()), 1),
        "sweeps": sum(p["sweeps"] for p in per.values()),
        "generation_cap": CAP, "shipped_generation_cap": dispatch.MAX_GENERATIONS,
        "recovery_slack": reconciler_mod.RECOVERY_SLACK,
        "violations": {kind: violations.get(kind, 0) for kind in VIOLATIONS},
        "answer_classes": dict(sorted(classes.items())),
        "connectors": per,
    }


def _coarse(kind: str) -> str:
    """An answer's class across connectors: an SMTP reply by its code's class and step."""
    role, _, what = kind.partition(": ")
    code, at, step = what.partition(" at ")
    if role == "smtp" and at and code.isdigit():
        return f"smtp: {code[0]}xx at {step}"
    return kind


def test_the_run_shows_zero_violations_across_the_four_connectors() -> None:
    if set(RESULTS) != set(CONNECTORS):
        pytest.skip("the totals are of the four connectors' runs together")
    found = figures()
    if os.environ.get("AGENTLEDGER_HOSTILE_EVIDENCE") == "1":
        EVIDENCE.parent.mkdir(parents=True, exist_ok=True)
        EVIDENCE.write_text(json.dumps(found, indent=2, ensure_ascii=False) + "\n")
    assert found["violations"] == dict.fromkeys(VIOLATIONS, 0)
    assert found["examples"] >= 4 * EXAMPLES
    if EXAMPLES < 300:
        return  # a short run may simply not have drawn every class
    # Each connector met both worlds (effects applied and not) and the hostility the issue
    # names, each class at least once: a generator that lost one fails here.
    for name, per in found["connectors"].items():
        assert 0 < per["applied_at_provider"] < per["examples"], name
    missing = [kind for kind in COVERED if not found["answer_classes"].get(kind)]
    assert not missing, missing


