"""The soak's report: ``reports/soak.json`` (operations by action and final state, faults by
kind, each invariant's violations with examples) and ``reports/soak.png`` (throughput per
10 s bucket with the faults over time)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.soak import checker

BUCKET_S = 10


def summary(*, minutes: float, seed: int, history: list[dict[str, Any]],
            snap: checker.Snapshot, findings: list[checker.Finding], settled: bool,
            errors: list[str], seconds: float, load_intact: bool = True) -> dict[str, Any]:
    struck = [r for r in history if r["kind"] == "fault" and r["phase"] == "struck"]
    decisions = Counter(("approved" if r["approve"] else "denied") + f":{r['result']}"
                        for r in history if r["kind"] == "decision")
    admissions = Counter(str(r.get("status")) for r in history if r["kind"] == "admission")
    states_by_action: dict[str, Counter[str]] = defaultdict(Counter)
    for action, outcome in outcomes(history, snap).values():
        states_by_action[action][outcome] += 1
    return {
        "minutes": minutes,
        "seed": seed,
        "seconds": round(seconds),
        # A load that died early leaves faults striking an idle system: not a soak.
        "ok": settled and load_intact and all(f.violations == 0 for f in findings),
        "settled": settled,
        "load_intact": load_intact,
        "operations": {
            "proposed": {a: dict(c) for a, c in checker.by_action(history).items()},
            "admitted": len(snap.commands),
            "by_final_state": dict(checker.final_states(snap)),
            # Per action, how each proposal ended: the command's final state, or what
            # became of it before admission (a denial, a refusal with its reason code).
            "by_action_and_outcome": {a: dict(c) for a, c in states_by_action.items()},
            "approval_decisions": dict(decisions),
            "admission_answers": dict(admissions),
            "provider_effects": sum(snap.effects.values()),
            # Late answers that contradicted a decided outcome, recorded (issue 37): allowed
            # only for a provider that cannot fence; a silent one is an invariant violation.
            "contradictions_recorded": checker.contradictions(snap),
        },
        "faults": {
            "injected": len(struck),
            "by_kind": dict(Counter(r["fault"] for r in struck)),
            "not_struck": [r["error"] for r in history
                           if r["kind"] == "phase" and r.get("name") == "fault_error"],
            "services_restarted_after_exiting_on_their_own": dict(Counter(
                r["service"] for r in history if r["kind"] == "service_exit")),
        },
        "invariants": {f.name: {"violations": f.violations, "examples": f.examples}
                       for f in findings},
        "errors": errors,
    }


def settled_state(state: str) -> bool:
    """Terminal, or ``unknown`` (recorded in doubt: no worker holds it any more)."""
    return state in checker.TERMINAL or state == "unknown"


def recovery(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault kind, what a fault cost the commands it caught: those in flight at some time
    while it was in place (admitted before its heal and not terminal or in doubt when it
    struck), and the seconds after the heal until the last of them was terminal or in doubt
    (0 when all were before the heal). ``never``: instances after which one never was."""
    timeline: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in history:
        if r["kind"] == "state":
            timeline[r["operation_id"]].append((r["t"], r["state"]))
    for states in timeline.values():
        states.sort()
    per_kind: dict[str, list[tuple[int, float | None]]] = defaultdict(list)
    struck: dict[str, float] = {}
    for r in history:
        if r["kind"] != "fault":
            continue
        if r["phase"] == "struck":
            struck[r["fault"]] = r["t"]
        if r["phase"] != "healed" or r["fault"] not in struck:
            continue
        began, healed = struck.pop(r["fault"]), r["t"]
        longest: float | None = 0.0
        caught = 0
        for states in timeline.values():
            if states[0][0] > healed:
                continue  # admitted after the heal
            at_strike = [state for t, state in states if t <= began]
            if at_strike and settled_state(at_strike[-1]):
                continue  # done before the fault struck
            caught += 1
            done = next((t for t, state in states if t > began and settled_state(state)), None)
            if done is None:
                longest = None
            elif longest is not None:
                longest = max(longest, done - healed)
        per_kind[r["fault"]].append((caught, longest))
    out: dict[str, dict[str, Any]] = {}
    for kind, runs in sorted(per_kind.items()):
        seconds = sorted(s for _, s in runs if s is not None)
        out[kind] = {
            "instances": len(runs),
            "commands_caught_max": max(c for c, _ in runs),
            "seconds_after_heal_max": round(seconds[-1], 1) if seconds else None,
            "seconds_after_heal_median": (round(seconds[len(seconds) // 2], 1)
                                          if seconds else None),
            "never": sum(1 for _, s in runs if s is None),
        }
    return out


def outcomes(history: list[dict[str, Any]], snap: checker.Snapshot) -> dict[str, tuple[str, str]]:
    """Operation id → (action, how it ended) for every proposal of the history."""
    refused = {r["operation_id"]: f"{r['status']}:{r.get('reason_code')}" for r in history
               if r["kind"] == "admission" and r.get("status") in ("rejected", "conflict")}
    out = {}
    for r in history:
        if r["kind"] != "proposal":
            continue
        op = r["operation_id"]
        cmd = snap.commands.get(op)
        if not r.get("acked"):
            ended = "not acknowledged"
        elif cmd is not None:
            ended = cmd.state
        elif op in refused:
            ended = refused[op]
        elif op in snap.approvals:
            ended = f"approval {snap.approvals[op]}"
        else:
            ended = "no answer"
        out[op] = (r["action"], ended)
    return out


def write(out: Path, *, logs: dict[str, str], **fields: Any) -> dict[str, Any]:
    data = summary(**fields)
    if not data["ok"]:
        data["service_logs"] = logs  # the evidence next to the failing history
    data["history"] = str(out / "soak" / "history.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    plot(fields["history"], out / "soak.png", title=f"soak: {fields['minutes']} min, "
         f"seed {fields['seed']}, {data['faults']['injected']} faults")
    return data


def throughput(history: list[dict[str, Any]]) -> tuple[list[float], list[int], list[int]]:
    """Per 10 s bucket: proposals acknowledged and commands seen reaching a terminal state."""
    acked: Counter[int] = Counter()
    done: Counter[int] = Counter()
    for r in history:
        if r["kind"] == "proposal" and r.get("acked"):
            acked[int(r["t"] // BUCKET_S)] += 1
        elif r["kind"] == "state" and r["state"] in checker.TERMINAL:
            done[int(r["t"] // BUCKET_S)] += 1
    last = max([*acked, *done, 0])
    return ([b * BUCKET_S for b in range(last + 1)], [acked[b] for b in range(last + 1)],
            [done[b] for b in range(last + 1)])


def plot(history: list[dict[str, Any]], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    # Time 0 is the start of the load (the stack's start-up is not part of the picture).
    t0 = next((r["t"] for r in history if r.get("name") == "load_started"), 0.0)
    history = [{**r, "t": r["t"] - t0} for r in history if r["t"] >= t0]
    starts, acked, done = throughput(history)
    fig, ax = plt.subplots(figsize=(12, 6))
    ax.step(starts, [a / BUCKET_S for a in acked], where="post", label="proposals acked / s")
    ax.step(starts, [d / BUCKET_S for d in done], where="post", label="commands terminal / s")
    kinds = sorted({r["fault"] for r in history if r["kind"] == "fault"})
    # tab20: a colour for each of up to twenty fault kinds (there are 13 today).
    colours = {k: plt.get_cmap("tab20")(i % 20) for i, k in enumerate(kinds)}
    opened: dict[str, float] = {}
    labelled: set[str] = set()
    for r in history:
        if r["kind"] != "fault":
            continue
        if r["phase"] == "inject":
            opened[r["fault"]] = r["t"]
        elif r["phase"] == "healed" and r["fault"] in opened:
            kind = r["fault"]
            ax.axvspan(opened.pop(kind), r["t"], color=colours[kind], alpha=0.25,
                       label=None if kind in labelled else kind)
            labelled.add(kind)
    ax.set_xlabel("seconds since the load began")
    ax.set_ylabel(f"per second ({BUCKET_S} s buckets)")
    ax.set_title(title)
    # Below the axes: the fault spans and the lines stay readable under it.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
