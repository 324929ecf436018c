"""The memo of Cedar answers: its bound, its counts and their metric (issue 41).

Why. Cedar costs ~0.1-0.15 CPU-ms per decision on this project's policy set (bench/README.md,
"What did not help"), mostly parsing each request's context and entities and validating them
against the schema, and the same questions recur: an agent's notes on one customer, the
executor's re-check of a command admission has just decided, a reviewer's page of requests.

What makes a hit correct. :class:`~agentledger.policy.cedar.CedarPolicy` puts every question
to Cedar through one function that builds Cedar's requests and entities from its arguments
only — the questions; the principal as the directory read it for this evaluation (tenant,
id, roles, revoked); the resource's tenant and id; the context as its JSON text; the other
principals the context names (an approval's requester) — and asks the instance's policy set
and schema, which are loaded once and never change (a process loads its policies when it
starts; new policies are a new instance, whose memo starts empty). The memo is keyed on
exactly those arguments, so it answers what Cedar would. A revocation or a role change, read
now, is another key, decided afresh; so are another amount, requester, action or resource.
An answer with an evaluation error, or a request Cedar could not parse (both deny), is never
memoised. The key costs ~7 µs against ~200 µs for Cedar (bench/README.md, "Levers").

Bounded (least recently used first out, ``AGENTLEDGER_POLICY_MEMO_SIZE`` entries, 0: off) and
safe to call from any thread (:func:`functools.lru_cache`; two threads missing on the same key
at once may both evaluate, and get the same answer).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Final, NamedTuple, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from agentledger import settings
from agentledger.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

METRIC: Final = "agentledger.policy.memo"


class MemoStats(NamedTuple):
    """What one memo did since its policy set was loaded.

    Attributes:
        hits: Decisions answered from the memo (one per ``evaluate``, ``may_approve`` or
            ``may_deny``, whatever the number of Cedar questions it asks).
        misses: Decisions put to Cedar (with the memo off, every one).
        entries: Answers held now.
        capacity: The bound (0: the memo is off).
    """

    hits: int
    misses: int
    entries: int
    capacity: int


class Memoised(Protocol):
    """Anything with a memo to count (a :class:`~agentledger.policy.cedar.CedarPolicy`)."""

    def memo_stats(self) -> MemoStats: ...


# Every live policy instance of the process; a service holds one for its lifetime, so the sum
# below only grows while it runs (instances a test drops leave it when collected).
_live: weakref.WeakSet[Memoised] = weakref.WeakSet()


def configured_size() -> int:
    """The memo's bound from ``AGENTLEDGER_POLICY_MEMO_SIZE`` (default 4,096)."""
    return settings.PolicySources().policy_memo_size


def register(memo: Memoised) -> None:
    """Count ``memo`` in the process's totals (the metric, :func:`log_stats`)."""
    _live.add(memo)


def totals() -> MemoStats:
    """The sum over the process's live policy instances."""
    every = [m.memo_stats() for m in list(_live)]
    return MemoStats(*(sum(column) for column in zip(*every, strict=True))) if every \
        else MemoStats(0, 0, 0, 0)


def log_stats() -> None:
    """One log line of what the memo did (at a service's stop, like ``batch_commit_stats``)."""
    t = totals()
    rate = t.hits / (t.hits + t.misses) if t.hits + t.misses else 0.0
    log.info("event=policy_memo_stats hits=%d misses=%d hit_rate=%.3f entries=%d capacity=%d",
             t.hits, t.misses, rate, t.entries, t.capacity)


def _observe(_options: CallbackOptions) -> Iterable[Observation]:
    # Read when the exporter collects, never on the decision's path: counting costs nothing.
    t = totals()
    return [Observation(t.hits, telemetry_metrics.labels(METRIC, ("outcome",),
                                                         {"outcome": "hit"})),
            Observation(t.misses, telemetry_metrics.labels(METRIC, ("outcome",),
                                                           {"outcome": "miss"}))]


def instrument(meter: Meter) -> None:
    """The observable counter ``agentledger.policy.memo`` (label ``outcome``: hit, miss) on
    ``meter``: the process's :func:`totals`, read when the exporter collects."""
    meter.create_observable_counter(
        METRIC, callbacks=[_observe], unit="{decision}",
        description="Cedar decisions answered from the policy memo (hit) or put to Cedar "
                    "(miss), summed over the process's policy sets.")


# On the global meter: a proxy until ``telemetry.setup`` installs a provider (as in
# agentledger.telemetry.metrics).
instrument(metrics.get_meter("agentledger"))
