"""Metrics with bounded labels only (R8.3).

A label name must be one of ``LABELS`` and a label value a short lower-case name (an action,
a connector, a state, an outcome): ids of operations, tenants and principals cannot pass —
their cardinality is unbounded, and they belong in traces or the audit ledger. A violation
raises at the call site, so a test exercising the code finds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Container, Iterable
from typing import Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

LABELS: Final = frozenset({"action", "connector", "state", "outcome", "stage", "topic.family"})
# Allowlisted action names, connector names, states and outcome codes all fit; a UUID (has
# '-'), a principal id (has ':'), a tenant id or free text does not.
_VALUE: Final = re.compile(r"^[a-z][a-z0-9_.]{0,63}$")
# Stands in for a value that is not a known name (an unlisted action in a rejected proposal).
OTHER: Final = "other"


class UnboundedLabel(ValueError):
    """A metric was given a label name outside ``LABELS`` or a value that is not a name."""


def _check_names(metric: str, names: tuple[str, ...]) -> None:
    unknown = [n for n in names if n not in LABELS]
    if unknown:
        raise UnboundedLabel(f"{metric}: label(s) {unknown} are not bounded; allowed: "
                             f"{sorted(LABELS)}")


def labels(metric: str, declared: tuple[str, ...], values: dict[str, str]) -> dict[str, str]:
    """``values`` checked against the metric's declared names and the bounded value shape.

    Raises:
        UnboundedLabel: an undeclared name, a missing one, or a value that is not a name.
    """
    if set(values) != set(declared):
        raise UnboundedLabel(f"{metric}: labels {sorted(values)} != declared {sorted(declared)}")
    for name, value in values.items():
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise UnboundedLabel(f"{metric}: the value of {name!r} is not a bounded name")
    return dict(values)


def bounded(value: str | None, known: Container[str] | None = None) -> str:
    """``value`` when it is a bounded name (and in ``known``, if given), else ``OTHER``."""
    if value is None or not _VALUE.fullmatch(value) or (known is not None and value not in known):
        return OTHER
    return value


class Counter:
    """A counter whose label names are declared once and checked on every ``add``."""

    def __init__(self, meter: Meter, name: str, *, unit: str, description: str,
                 labels: tuple[str, ...]) -> None:
        _check_names(name, labels)
        self.name, self.declared = name, labels
        self.unit, self.description = unit, description
        self._counter = meter.create_counter(name, unit=unit, description=description)

    def add(self, amount: int = 1, **values: str) -> None:
        self._counter.add(amount, labels(self.name, self.declared, values))


class Histogram:
    """A histogram whose label names are declared once and checked on every ``record``."""

    def __init__(self, meter: Meter, name: str, *, unit: str, description: str,
                 labels: tuple[str, ...]) -> None:
        _check_names(name, labels)
        self.name, self.declared = name, labels
        self.unit, self.description = unit, description
        self._histogram = meter.create_histogram(name, unit=unit, description=description)

    def record(self, amount: float, **values: str) -> None:
        self._histogram.record(amount, labels(self.name, self.declared, values))


class UnknownBacklog:
    """The ``unknown`` backlog per connector, as the reconciler last counted it: two
    observable gauges read the snapshot ``update`` replaces once per sweep (the exporter's
    callbacks never touch the database, and report nothing before the first count).

    A connector the reconciler serves is reported even with nothing ``unknown`` (0 commands,
    age 0), so an alert on it resolves once the backlog is settled; one it does not serve is
    reported while it has ``unknown`` commands. Connector names outside the bounded shape
    are reported together as ``other`` (counts summed, the oldest age kept).
    """

    def __init__(self, meter: Meter, clock: Callable[[], float] = time.monotonic) -> None:
        self.declared = ("connector",)
        _check_names("agentledger.commands.unknown", self.declared)
        self._clock = clock
        # connector → (commands, when the oldest was first sent on ``clock``, None with none)
        self._counted: dict[str, tuple[int, float | None]] | None = None
        meter.create_observable_gauge(
            "agentledger.commands.unknown", callbacks=[self._observe_commands],
            unit="{command}",
            description="Commands in state `unknown` now, across tenants, by connector "
                        "(counted by the reconciler once per sweep).")
        meter.create_observable_gauge(
            "agentledger.commands.unknown.oldest_age", callbacks=[self._observe_age],
            unit="s",
            description="Seconds since the oldest `unknown` command of a connector was first "
                        "sent (0 with none); it keeps growing between sweeps, and while "
                        "sweeps fail, so a stalled reconciler cannot hide an old one.")

    def update(self, backlog: Iterable[tuple[str, int, float]], served: Iterable[str]) -> None:
        """Replace the snapshot: ``backlog`` holds (connector, commands, oldest age in s) for
        each connector with ``unknown`` commands; ``served`` are reported at 0 otherwise."""
        now = self._clock()
        counted: dict[str, tuple[int, float | None]] = {bounded(name): (0, None)
                                                        for name in served}
        for name, commands, oldest_age_s in backlog:
            label = bounded(name)
            seen, since = counted.get(label, (0, None))
            first = now - oldest_age_s
            counted[label] = (seen + commands, first if since is None else min(since, first))
        # Replaced whole, in one assignment: the exporter's thread never sees a half-built one.
        self._counted = counted

    def _observe_commands(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(commands, labels("agentledger.commands.unknown", self.declared,
                                             {"connector": name}))
                for name, (commands, _age) in sorted((self._counted or {}).items())]

    def _observe_age(self, _options: CallbackOptions) -> Iterable[Observation]:
        now = self._clock()
        return [Observation(0.0 if since is None else max(now - since, 0.0),
                            labels("agentledger.commands.unknown.oldest_age", self.declared,
                                   {"connector": name}))
                for name, (_commands, since) in sorted((self._counted or {}).items())]


# The global meter is a proxy until ``telemetry.setup`` installs a provider; instruments made
# on it now start recording then (and are no-ops in a process that never sets one up).
_meter = metrics.get_meter("agentledger")

admissions = Counter(
    _meter, "agentledger.admissions", unit="{proposal}",
    description="Proposals answered by admission, by status and allowlisted action.",
    labels=("outcome", "action"))
authorizations = Counter(
    _meter, "agentledger.authorizations", unit="{decision}",
    description="Policy decisions by stage (admission, dispatch, approval) and effect.",
    labels=("stage", "outcome"))
dispatch_outcomes = Counter(
    _meter, "agentledger.dispatch.outcomes", unit="{command}",
    description="States recorded by the executor at the end of a dispatch.",
    labels=("state", "connector"))
attempt_duration = Histogram(
    _meter, "agentledger.attempt.duration", unit="s",
    description="One connector call (first send, reconnect or keyed resend) to its answer.",
    labels=("connector", "outcome"))
reconciliations = Counter(
    _meter, "agentledger.reconciliations", unit="{command}",
    description="Commands the reconciler recovered, by what it did.",
    labels=("connector", "outcome"))
approval_decisions = Counter(
    _meter, "agentledger.approval.decisions", unit="{decision}",
    description="Human decisions on approval requests, by result and action.",
    labels=("outcome", "action"))
notifications = Counter(
    _meter, "agentledger.notifications", unit="{notification}",
    description="Approval notifications the notifier attempted, by notifier plugin (as "
                "`connector`) and outcome (sent, retry, failed).",
    labels=("connector", "outcome"))
dead_letters = Counter(
    _meter, "agentledger.dead_letters", unit="{message}",
    description="Messages a consumer sent to a dead-letter topic (once published), by the "
                "source topic's family and the error code.",
    labels=("topic.family", "outcome"))
leases_expired = Counter(
    _meter, "agentledger.leases.expired", unit="{claim}",
    description="Take-overs by the reconciler of a `dispatching` command whose lease ran out.",
    labels=("connector",))
retries_capped = Counter(
    _meter, "agentledger.retries.capped", unit="{command}",
    description="Commands held `unknown` for an operator at the cap of dispatch generations.",
    labels=("connector",))
unknown_backlog = UnknownBacklog(_meter)
unclassified_answers = Counter(
    _meter, "agentledger.provider.unclassified", unit="{answer}",
    description="Connector answers the boundary could not take as given (an exception, a "
                "value of another type): recorded as in doubt. By connector and call "
                "(execute, lookup, fence).",
    labels=("connector", "stage"))
late_answers = Counter(
    _meter, "agentledger.late_answers", unit="{answer}",
    description="Answers a worker received after its claim was taken over, recorded on its "
                "attempt (never dropped), by connector and what the provider said.",
    labels=("connector", "outcome"))
contradictions = Counter(
    _meter, "agentledger.contradictions", unit="{command}",
    description="Commands whose recorded outcome a provider's later answer contradicts "
                "(e.g. resolved `failed`, then a late call applied): an operator must act.",
    labels=("connector",))
sweep_failures = Counter(
    _meter, "agentledger.reconciler.item_failures", unit="{item}",
    description="Items of a reconciler sweep that raised; the sweep went on with the others "
                "and the item is tried again next period (within its generation cap).",
    labels=("connector",))
