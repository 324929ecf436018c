"""The soak's checker: pure functions over the history (tests/soak/history.py) and a final
snapshot of the ledger, the topics and the providers. No I/O: tests/unit/test_soak_checker.py
feeds it synthetic histories that break each invariant.

Each invariant answers one question with a count of violations and a few examples:

- ``terminal_once``: every admitted operation ends in exactly one terminal state, or
  ``unknown`` with a reason; no poll ever saw it leave a terminal state or change it.
- ``proposals_answered``: every proposal the broker acknowledged was admitted, asked for
  approval, or refused with an answer on the admissions topic: none vanished.
- ``effects_match``: the provider's effects equal the ``succeeded`` commands: one per
  success, none twice (``unknown`` may have at most one), none the ledger cannot account
  for; one for a command the ledger says did not happen is ``no_silent_contradiction``'s.
- ``unknown_allowed``: ``unknown`` only where the connector's contract allows it: a
  connector without lookup after an attempt may have reached it; a keyed connector with
  lookup only when held for an operator (retry cap, key retention run out).
- ``published``: every admitted command has a record on its ``exec.<connector>.v1`` topic.
- ``audited``: every terminal command has its admission and terminal audit events in the
  ledger, every one of them on the audit topic, and ``explain`` reports the ledger's state,
  receipt and events.
- ``slot_never_past_owed``: the relay never confirmed its slot past a transaction whose outbox
  rows were still owed (see ``slot_never_past_owed`` for why the test is sound).
- ``no_missing_dead_letters``: no exec record was dead-lettered as naming no command.
- ``denied_never_admitted``: a request the approver denied never became a command.
- ``no_silent_contradiction`` (issue 37): a command decided as not done (failed, denied,
  expired, review required) whose effect the provider holds is flagged contradicted — never
  silent; and only a provider that cannot fence may contradict at all (with a fence, the
  late call is refused).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentledger.contracts import commands

TERMINAL = commands.TERMINAL_STATES
# Examples kept per invariant in the report: enough to start a diagnosis, not the whole run.
EXAMPLES = 5
# The reasons with which a command of a keyed, looked-up connector is held for an operator
# (agentledger.ledger.dispatch.requeue's cap, the reconciler's retention bound).
OPERATOR_HOLDS = ("retry cap", "retention")


@dataclass(frozen=True)
class Contract:
    """The part of a connector's declared contract the checker needs."""

    idempotency: str  # keyed | replay_safe | none
    lookup: bool
    fencing: bool = False


@dataclass(frozen=True)
class Command:
    """One ``agent_command`` row at the end of the soak."""

    operation_id: str
    action: str
    connector: str
    state: str
    receipt: str | None = None
    reason: str | None = None
    attempts: int = 0
    # The provider later said otherwise (agent_command.contradicted_at is set: issue 37).
    contradicted: bool = False


@dataclass(frozen=True)
class Explained:
    """What ``agentledger.audit.explain`` answered for one operation."""

    state: str
    receipt: str | None
    event_ids: frozenset[str]


@dataclass(frozen=True)
class Snapshot:
    """The end of the soak, once settled: the ledger, the topics, the providers."""

    commands: Mapping[str, Command]
    contracts: Mapping[str, Contract]
    # Provider effects per operation id (keyed connectors: by idempotency key; refunds: by
    # the invoice id the load derives from the operation id).
    effects: Mapping[str, int]
    # Effects no operation of the soak accounts for (a key or invoice the load never used).
    stray_effects: tuple[str, ...] = ()
    approvals: Mapping[str, str] = field(default_factory=dict)  # operation id → last state
    published: frozenset[str] = frozenset()  # operation ids with a record on their exec topic
    ledger_audit: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # op → id → type
    topic_audit: Mapping[str, frozenset[str]] = field(default_factory=dict)  # op → event ids
    explained: Mapping[str, Explained] = field(default_factory=dict)
    missing_dead_letters: int = 0


@dataclass
class Finding:
    """One invariant's result."""

    name: str
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def violated(self, example: str) -> None:
        self.violations += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)


History = list[dict[str, Any]]


def of_kind(history: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in history if r.get("kind") == kind]


def terminal_once(history: History, snap: Snapshot) -> Finding:
    found = Finding("terminal_once")
    for op, cmd in sorted(snap.commands.items()):
        if cmd.state == "unknown" and not cmd.reason:
            found.violated(f"{op} ({cmd.action}) is unknown without a reason")
        elif cmd.state != "unknown" and cmd.state not in TERMINAL:
            found.violated(f"{op} ({cmd.action}) never settled: {cmd.state}")
    first_terminal: dict[str, str] = {}
    for r in of_kind(history, "state"):
        op, state = r["operation_id"], r["state"]
        if op in first_terminal and state != first_terminal[op]:
            found.violated(f"{op} was seen {first_terminal[op]}, then {state} at t={r['t']}")
        elif state in TERMINAL:
            first_terminal.setdefault(op, state)
    for op, state in sorted(first_terminal.items()):
        last = snap.commands.get(op)
        if last is not None and last.state != state:
            found.violated(f"{op} was seen {state}, the ledger ends {last.state}")
    return found


def proposals_answered(history: History, snap: Snapshot) -> Finding:
    found = Finding("proposals_answered")
    refused = {r["operation_id"] for r in of_kind(history, "admission")
               if r.get("status") in ("rejected", "conflict")}
    for r in of_kind(history, "proposal"):
        op = r["operation_id"]
        if r.get("acked") and op not in snap.commands and op not in snap.approvals \
                and op not in refused:
            found.violated(f"{op} ({r['action']}) acknowledged at t={r['t']}: no command, no "
                           "approval request, no refusal")
    return found


def effects_match(history: History, snap: Snapshot) -> Finding:
    found = Finding("effects_match")
    for op, cmd in sorted(snap.commands.items()):
        n = snap.effects.get(op, 0)
        if cmd.state == "succeeded" and n != 1:
            found.violated(f"{op} ({cmd.action}) succeeded with {n} provider effects")
        elif n > 1:
            found.violated(f"{op} ({cmd.action}) {cmd.state} with {n} provider effects")
        # A command decided as not done whose effect exists: no_silent_contradiction.
    for op, n in sorted(snap.effects.items()):
        if op not in snap.commands and n:
            found.violated(f"{n} provider effects for {op}, which the ledger never admitted")
    for stray in snap.stray_effects:
        found.violated(f"a provider effect no operation accounts for: {stray}")
    return found


def why_unknown_is_wrong(cmd: Command, contract: Contract | None) -> str | None:
    """Why this ``unknown`` is not one the contract allows (None: it is allowed, and final
    until an operator acts). A keyed connector with lookup has its unknowns looked up again
    by the reconciler: only one held for an operator stays."""
    if contract is None:
        return f"unknown on {cmd.connector}, whose contract is not known"
    if contract.lookup:
        if not any(hold in (cmd.reason or "") for hold in OPERATOR_HOLDS):
            return f"unknown on a connector with lookup, not held for an operator: {cmd.reason!r}"
    elif cmd.attempts == 0:
        return "unknown though no attempt was ever made"
    return None


def settled(cmd: Command, contracts: Mapping[str, Contract]) -> bool:
    """Whether nothing more will happen to the command without an operator."""
    return cmd.state in TERMINAL or (
        cmd.state == "unknown" and why_unknown_is_wrong(cmd, contracts.get(cmd.connector)) is None)


def unknown_allowed(history: History, snap: Snapshot) -> Finding:
    found = Finding("unknown_allowed")
    for op, cmd in sorted(snap.commands.items()):
        if cmd.state != "unknown":
            continue
        wrong = why_unknown_is_wrong(cmd, snap.contracts.get(cmd.connector))
        if wrong is not None:
            found.violated(f"{op} ({cmd.action}): {wrong}")
    return found


def published(history: History, snap: Snapshot) -> Finding:
    found = Finding("published")
    for op, cmd in sorted(snap.commands.items()):
        if op not in snap.published:
            found.violated(f"{op} ({cmd.action}, {cmd.state}): admitted, never on "
                           f"exec.{cmd.connector}.v1")
    return found


def audited(history: History, snap: Snapshot) -> Finding:
    found = Finding("audited")
    # Whether an event reached the topic is asked by its id, whatever operation its record
    # names: a soak once counted a `proposal.rejected` event as missing because its record
    # named no operation (the payload lacked it; fixed), though the id was on the topic.
    on_topic = frozenset().union(*snap.topic_audit.values())
    for op, cmd in sorted(snap.commands.items()):
        events = snap.ledger_audit.get(op, {})
        if cmd.state in TERMINAL:
            types = set(events.values())
            for wanted in ("command.admitted", f"command.{cmd.state}"):
                if wanted not in types:
                    found.violated(f"{op} ended {cmd.state} without a {wanted} audit event")
            missing = set(events) - on_topic
            if missing:
                found.violated(f"{op}: {len(missing)} audit events never reached the audit "
                               f"topic ({sorted(events[m] for m in missing)})")
            # Per event, not `set(events) & on_topic - named`: that builds a copy of every
            # audit id on the topic for each command — quadratic, an hour of checking after
            # a soak at load (75,000 commands).
            named = snap.topic_audit.get(op, frozenset())
            unnamed = {e for e in events if e in on_topic and e not in named}
            if unnamed:
                found.violated(f"{op}: {len(unnamed)} audit records on the topic do not name "
                               f"their operation ({sorted(events[m] for m in unnamed)})")
        said = snap.explained.get(op)
        if said is None:
            found.violated(f"{op}: explain had no answer")
        elif (said.state, said.receipt) != (cmd.state, cmd.receipt):
            found.violated(f"{op}: explain says {said.state}/{said.receipt}, the ledger "
                           f"{cmd.state}/{cmd.receipt}")
        elif said.event_ids != frozenset(events):
            found.violated(f"{op}: explain shows {len(said.event_ids)} events, the audit "
                           f"ledger {len(events)}")
    return found


def slot_never_past_owed(history: History, snap: Snapshot) -> Finding:
    """Each ``slot`` observation is three reads, in this order: (1) in one statement, the
    outbox rows present (``before``: table, id and ``xmin`` — one tuple version) and the
    primary's WAL write position ``lsn``; (2) the slot's ``confirmed`` flush position;
    (3) the outbox rows present again (``after``).

    A row visible in (1) was committed before the statement's snapshot, so its commit
    record ends at or before ``lsn`` (a commit is flushed before it becomes visible). A row
    in both (1) and (3) was present — owed, never swept — the whole time in between, because
    a tuple version never comes back once deleted. Logical decoding counts a transaction as
    confirmed once ``confirmed`` passes the start of its commit record. So ``confirmed >=
    lsn`` with such a row means the relay confirmed past a transaction whose rows were still
    owed: what R4.6 forbids (a crash then would lose them). Sound, not complete: a confirm
    between the commit and ``lsn`` goes unseen; polling often keeps that window small.
    """
    found = Finding("slot_never_past_owed")
    for r in of_kind(history, "slot"):
        if r["confirmed"] is None or r["confirmed"] < r["lsn"]:
            continue
        owed = {tuple(row) for row in r["before"]} & {tuple(row) for row in r["after"]}
        if owed:
            found.violated(f"t={r['t']}: slot confirmed {r['confirmed']} >= {r['lsn']} with "
                           f"{len(owed)} rows owed, e.g. {sorted(owed)[0]}")
    return found


def no_missing_dead_letters(history: History, snap: Snapshot) -> Finding:
    found = Finding("no_missing_dead_letters")
    for _ in range(snap.missing_dead_letters):
        found.violated("an exec record dead-lettered as naming no command in the ledger")
    return found


def denied_never_admitted(history: History, snap: Snapshot) -> Finding:
    found = Finding("denied_never_admitted")
    for r in of_kind(history, "decision"):
        if not r["approve"] and r.get("result") == "ok" and r["operation_id"] in snap.commands:
            cmd = snap.commands[r["operation_id"]]
            found.violated(f"{cmd.operation_id} ({cmd.action}) denied at t={r['t']}, admitted "
                           f"as {cmd.state}")
    return found


def no_silent_contradiction(history: History, snap: Snapshot) -> Finding:
    found = Finding("no_silent_contradiction")
    for op, cmd in sorted(snap.commands.items()):
        applied = snap.effects.get(op, 0) > 0
        decided_otherwise = cmd.state in TERMINAL and cmd.state != "succeeded"
        if applied and decided_otherwise and not cmd.contradicted:
            found.violated(f"{op} ({cmd.action}) ended {cmd.state}, the provider holds its "
                           "effect, and nothing says so")
        contract = snap.contracts.get(cmd.connector)
        if cmd.contradicted and (contract is None or contract.fencing):
            found.violated(f"{op} ({cmd.action}) contradicted on {cmd.connector}, whose "
                           "provider fences: its late call should have been refused")
    return found


def contradictions(snap: Snapshot) -> int:
    """Contradictions the ledger recorded (allowed only where the provider cannot fence)."""
    return sum(1 for cmd in snap.commands.values() if cmd.contradicted)


INVARIANTS: tuple[Callable[[History, Snapshot], Finding], ...] = (
    terminal_once, proposals_answered, effects_match, unknown_allowed, published, audited,
    slot_never_past_owed, no_missing_dead_letters, denied_never_admitted,
    no_silent_contradiction)


def check(history: History, snap: Snapshot) -> list[Finding]:
    """Every invariant over the whole history and the final snapshot."""
    return [invariant(history, snap) for invariant in INVARIANTS]


def final_states(snap: Snapshot) -> Counter[str]:
    return Counter(cmd.state for cmd in snap.commands.values())


def by_action(history: History) -> dict[str, Counter[str]]:
    """Per action: proposals sent and acknowledged."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for r in of_kind(history, "proposal"):
        out[r["action"]]["sent"] += 1
        out[r["action"]]["acknowledged"] += bool(r.get("acked"))
    return dict(out)
